"""A real headless browser for the tests that load orch's pages as a user does.

Debian's Chromium (`chromium`) driven through selenium by Debian's driver (`chromium-driver`),
both installed by `scripts/setup.sh --tests`. Selenium Manager is never asked for anything: the
driver's path is given, so nothing is downloaded.

The browser is kept off every network but the test's own:

- `--host-resolver-rules` maps every host name to NOTFOUND except `localhost`, 127.0.0.1 and
  the IP literals a test names (`allow`): a page that asks for any other name, or any other
  address, gets `ERR_NAME_NOT_RESOLVED` before a DNS query or a connection is made;
- no background traffic: no component updates, no sync, no default apps, no first-run tasks,
  no metrics, no safe-browsing pings (`FLAGS`);
- a throwaway profile in the test's directory, so nothing of one test reaches the next.

Run as root, so `--no-sandbox` (Chromium refuses to start a sandboxed root browser).

`open_browser` is a context manager; the `browser` fixture (tests/conftest.py) opens one per
test. On exit the driver quits and every Chromium process it started must be gone within
`EXIT_TIMEOUT_S` s, else the test fails naming them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service

from tests.support.waiting import wait_until

DRIVER = Path("/usr/bin/chromedriver")
# The program Debian's /usr/bin/chromium launcher execs: started directly, the launcher's
# site-wide settings (/etc/chromium.d: extensions loaded from disk, Google API keys) stay out.
CHROMIUM = Path("/usr/lib/chromium/chromium")
DESKTOP = (1366, 900)
NARROW = (390, 844)  # a phone held upright
SCREENSHOTS_ENV = "ORCH_SCREENSHOTS"
EXIT_TIMEOUT_S = 10.0
PAGE_LOAD_S = 45  # a page load is tried once more after this long (`Browser.get`)
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"  # see `Browser.console_errors`
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--password-store=basic",
    "--use-mock-keychain",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
)
# The loopback names a page may always use; every other name and address needs `allow`.
LOOPBACK = ("localhost", "127.0.0.1")


class MissingBrowser(AssertionError):
    """Chromium or its driver is not installed."""


def resolver_rules(allow: Iterable[str] = ()) -> str:
    """The `--host-resolver-rules` value: every host to NOTFOUND but loopback and `allow`.

    The rules match IP literals too, so an address the browser may reach is named here."""
    hosts = [*LOOPBACK, *allow]
    for host in hosts:
        if not re.fullmatch(r"[A-Za-z0-9.:\-]+", host):
            raise ValueError(f"not a host name or address: {host!r}")
    return ", ".join(["MAP * ~NOTFOUND", *(f"EXCLUDE {host}" for host in hosts)])


class Browser:
    """One driven Chromium window. `driver` is selenium's WebDriver for what the helpers miss."""

    def __init__(self, driver: webdriver.Chrome, screenshots: Path) -> None:
        self.driver = driver
        self.screenshots = screenshots
        self._log: list[dict[str, object]] = []

    def get(self, url: str) -> None:
        """Load `url` and wait for its document to be loaded. A load that has not ended in
        `PAGE_LOAD_S` is tried once more: Chromium drops requests in flight when the machine's
        network changes (the suite's other tests add and remove bridges and namespaces)."""
        try:
            self.driver.get(url)
        except TimeoutException:
            self.driver.get(url)

    def set_size(self, width: int, height: int) -> None:
        """Make the page's viewport `width` x `height` CSS pixels (what a screenshot holds):
        the window is that plus the browser's own frame, measured here."""
        self.driver.set_window_size(width, height)
        inner = self.driver.execute_script("return [window.innerWidth, window.innerHeight];")
        frame_w, frame_h = width - int(inner[0]), height - int(inner[1])
        if frame_w or frame_h:
            self.driver.set_window_size(width + frame_w, height + frame_h)

    def screenshot(self, name: str) -> Path:
        """The window as `<name>.png` in the screenshot directory; returns its path.

        The directory is `$ORCH_SCREENSHOTS` when set (to look at the pages after a run), else
        the test's own temporary directory."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ValueError(f"a screenshot's name is a plain file name: {name!r}")
        self.screenshots.mkdir(parents=True, exist_ok=True)
        path = self.screenshots / f"{name}.png"
        if not self.driver.save_screenshot(str(path)):
            raise AssertionError(f"the browser wrote no screenshot {path}")
        return path

    def text(self, css: str) -> str:
        """The visible text of the first element matching `css` ('' if none matches), read in
        one step in the page: a live page may replace the element between a lookup and a read."""
        found = self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
        )
        return str(found or "").strip()

    def attributes(self, css: str, name: str) -> list[str | None]:
        """Attribute `name` of every element matching `css`, read in one step in the page (a
        live page replaces its rows between a lookup and a read)."""
        found = self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])]"
            ".map(e => e.getAttribute(arguments[1]));",
            css,
            name,
        )
        return list(found or [])

    def wait_text(self, css: str, predicate: Callable[[str], bool], timeout: float = 10.0) -> str:
        """The text of the element matching `css` once `predicate` holds for it; fails after
        `timeout` s naming the selector and the last text seen."""
        last = [""]

        def check() -> str | None:
            last[0] = self.text(css)
            return last[0] if predicate(last[0]) else None

        def fail(message: str) -> AssertionError:
            return AssertionError(f"{message}; text seen: {last[0]!r}")

        return wait_until(check, f"text of {css!r} to match", timeout, interval=0.1, fail=fail)

    def console_errors(self) -> list[str]:
        """Every error the page reported since the browser started: JavaScript exceptions,
        `console.error` calls and failed loads (the browser log's SEVERE entries), except
        the loads Chromium dropped because the machine's network changed (`NETWORK_CHANGED`:
        the suite's other tests add and remove interfaces; the page asks again at its next
        poll)."""
        self._log.extend(self.driver.get_log("browser"))
        return [
            str(e["message"])
            for e in self._log
            if e.get("level") == "SEVERE" and NETWORK_CHANGED not in str(e["message"])
        ]


def _profile_processes(profile: Path) -> list[psutil.Process]:
    """Every live process whose command line names the profile directory."""
    found = []
    marker = str(profile)
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(marker in arg for arg in process.info["cmdline"] or ()):
                found.append(process)
    return found


def _alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def check_installed() -> None:
    """Fail with the command that installs Chromium and its driver when either is missing."""
    missing = [str(p) for p in (DRIVER, CHROMIUM) if not os.access(p, os.X_OK)]
    if missing:
        raise MissingBrowser(
            f"{', '.join(missing)} missing: run `make setup-tests` "
            "(apt-get install -y chromium chromium-driver)"
        )


@contextlib.contextmanager
def open_browser(
    directory: Path, *, allow: Iterable[str] = (), size: tuple[int, int] = DESKTOP
) -> Iterator[Browser]:
    """A headless Chromium of its own profile under `directory`, at `size`, that may reach only
    loopback and the IP literals in `allow`. At exit the driver quits and every process it
    started must end within `EXIT_TIMEOUT_S` s."""
    check_installed()
    profile = directory / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--host-resolver-rules={resolver_rules(allow)}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The browser keeps a few files by its home whatever its profile (crash reports, a cache):
    # a home in the test's directory keeps the machine's own untouched.
    home = directory / "chromium-home"
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    service = Service(
        executable_path=str(DRIVER), log_output=str(directory / "chromedriver.log"), env=env
    )
    env_screens = os.environ.get(SCREENSHOTS_ENV)
    screenshots = Path(env_screens) if env_screens else directory / "screenshots"
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(PAGE_LOAD_S)  # sooner than the driver's own 120 s read limit
    started: list[psutil.Process] = []
    try:
        driver_pid = driver.service.process.pid
        with contextlib.suppress(psutil.Error):
            started = [psutil.Process(driver_pid)]
            started += started[0].children(recursive=True)
        opened = Browser(driver, screenshots)
        opened.set_size(*size)
        yield opened
    finally:
        started += _profile_processes(profile)
        with contextlib.suppress(psutil.Error):
            started += psutil.Process(driver.service.process.pid).children(recursive=True)
        driver.quit()
        left = _settle(started)
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if left:
            raise AssertionError(f"browser processes left running after quit: {left}")


def _settle(started: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of `started` still alive after `EXIT_TIMEOUT_S` s (empty: all ended)."""
    left: list[psutil.Process] = []

    def ended() -> bool:
        left[:] = _alive(started)
        return not left

    with contextlib.suppress(AssertionError):
        wait_until(ended, "browser processes to end", EXIT_TIMEOUT_S, interval=0.1)
    return left
