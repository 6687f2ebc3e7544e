"""The harness of the dashboard's browser tests, tried on a stand-in server.

The stand-in keeps the contract of `orch dashboard` that `DashboardProcess` relies on (the URL
and token lines, `/healthz`, exit 0 on SIGTERM or SIGINT) and serves two pages: `/live`, whose
script changes a text a second after loading, and `/probe`, which asks for names and addresses
the browser may not reach. Every request that reaches it is printed (`hit: PATH`), so a test sees
in its output whether the browser reached it.
"""

from __future__ import annotations

import signal
import struct
import sys
from pathlib import Path

import psutil
import pytest
from selenium.common.exceptions import WebDriverException

from tests.support.browser import DESKTOP, NARROW, Browser, open_browser
from tests.support.dashboard_run import DashboardProcess, namespace_address

STAND_IN = r'''
import argparse, http.server, ipaddress, secrets, signal, sys

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--bind")
parser.add_argument("--allow-actions", action="store_true")
args = parser.parse_args()

LIVE = b"""<!doctype html><title>live</title><p id="t">waiting</p>
<script>
setTimeout(() => { document.getElementById("t").textContent = "changed"; }, 1000);
</script>"""
PROBE = """<!doctype html><title>probe</title><p id="t">asking</p><script>
const asks = %s;
const ask = u => fetch(u, {mode: "no-cors"}).then(() => u + " answered", () => u + " failed");
Promise.all(asks.map(ask))
  .then(r => { document.getElementById("t").textContent = r.join("; "); });
</script>"""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(f"hit: {self.headers.get('Host')} {self.path}", flush=True)
        if self.path == "/healthz":
            body, kind = b"ok", "text/plain"
        elif self.path == "/live":
            body, kind = LIVE, "text/html"
        elif self.path.startswith("/probe?"):
            asks = [u for u in self.path.split("?", 1)[1].split(",") if u]
            body, kind = (PROBE % repr(asks)).encode(), "text/html"
        else:
            body, kind = b"nothing here", "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def stop(signum, frame):
    raise SystemExit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
server = http.server.ThreadingHTTPServer((args.bind, args.port), Handler)
if not ipaddress.ip_address(args.bind).is_loopback:
    print(f"token: {secrets.token_urlsafe(16)}", flush=True)
print(f"dashboard: http://{args.bind}:{args.port}/", flush=True)
server.serve_forever()
'''


def stand_in(tmp_path: Path) -> list[str]:
    script = tmp_path / "stand_in_dashboard.py"
    script.write_text(STAND_IN)
    return [sys.executable, str(script)]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file, from its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def hits(dashboard: DashboardProcess, path: str) -> list[str]:
    """The requests that reached the stand-in for a path that begins with `path`."""
    found = [line.split() for line in dashboard.output.splitlines() if line.startswith("hit: ")]
    return [words[2] for words in found if len(words) == 3 and words[2].startswith(path)]


def test_a_script_changes_the_page_without_a_reload_and_screenshots_at_both_sizes(
    browser: Browser, tmp_path: Path
) -> None:
    with DashboardProcess(tmp_path / "orch", command=stand_in(tmp_path)) as dashboard:
        assert dashboard.token is None  # loopback: no token
        browser.get(dashboard.url + "live")
        browser.driver.execute_script("window.sameDocument = true;")
        assert browser.text("#t") == "waiting"
        browser.wait_text("#t", lambda text: text == "changed", timeout=5)
        # a reload would have dropped the mark and asked for the page again
        assert browser.driver.execute_script("return window.sameDocument === true;")
        assert len(hits(dashboard, "/live")) == 1
        desktop = browser.screenshot("live-desktop")
        browser.set_size(*NARROW)
        narrow = browser.screenshot("live-narrow")
        assert browser.console_errors() == []
    assert desktop.parent == narrow.parent == browser.screenshots
    assert png_size(desktop) == DESKTOP and png_size(narrow) == NARROW


def test_screenshots_go_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_SCREENSHOTS", str(tmp_path / "from-env"))
    with open_browser(tmp_path / "b") as browser:
        browser.get("data:text/html,<p>hello</p>")
        shot = browser.screenshot("hello")
    assert shot == tmp_path / "from-env" / "hello.png" and png_size(shot)[0] > 0


def test_a_page_gets_nothing_from_a_name_it_may_not_ask_for(
    browser: Browser, tmp_path: Path
) -> None:
    with DashboardProcess(tmp_path / "orch", command=stand_in(tmp_path)) as dashboard:
        port = dashboard.port
        asks = [
            f"http://probe.localhost:{port}/hit-name",  # Chromium's own loopback name
            "http://example.com/hit-outside",
        ]
        browser.get(f"{dashboard.url}probe?{','.join(asks)}")
        text = browser.wait_text("#t", lambda t: t.count("failed") + t.count("answered") == 2)
        assert text.count("failed") == 2, text
        assert hits(dashboard, "/hit") == [], dashboard.output
        assert any("ERR_NAME_NOT_RESOLVED" in e for e in browser.console_errors())


def test_a_dashboard_in_a_namespace_is_reached_only_by_a_browser_allowed_its_address(
    browser: Browser, tmp_path: Path
) -> None:
    with (
        namespace_address() as link,
        DashboardProcess(tmp_path / "orch", link=link, command=stand_in(tmp_path)) as dashboard,
    ):
        assert dashboard.url == f"http://{link.address}:{dashboard.port}/"
        assert dashboard.token and len(dashboard.token) >= 16
        with pytest.raises(WebDriverException, match="ERR_NAME_NOT_RESOLVED"):
            browser.get(dashboard.url + "live")
        assert hits(dashboard, "/live") == []
        with open_browser(tmp_path / "allowed", allow=[link.address]) as allowed:
            allowed.get(dashboard.url + "live")
            allowed.wait_text("#t", lambda text: text == "changed", timeout=5)
        assert len(hits(dashboard, "/live")) == 1
        assert dashboard.stop(signal.SIGINT) == 0
    assert not Path(f"/run/netns/{link.ns}").exists()


def test_nothing_of_the_browser_is_left_running(tmp_path: Path) -> None:
    with open_browser(tmp_path) as browser:
        browser.get("data:text/html,<p>hello</p>")
        driver = psutil.Process(browser.driver.service.process.pid)
        started = [driver, *driver.children(recursive=True)]
        assert any("chromium" in p.name() for p in started), started
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == []


def test_orch_dashboard_keeps_the_contract_the_harness_reads(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    with DashboardProcess(home) as local:
        assert local.token is None  # loopback: no token
        assert local.get("/healthz") == (200, "ok")
    assert local.returncode == 0  # SIGTERM
    with namespace_address() as link, DashboardProcess(home, link=link) as remote:
        assert remote.url == f"http://{link.address}:{remote.port}/"
        assert remote.token
        assert remote.get("/healthz") == (200, "ok")  # no token needed
        assert remote.stop(signal.SIGINT) == 0
