"""`orch dashboard` in a real headless Chromium, over a ledger with two real jobs on local nodes:
one that counts steps on a GPU (the nvidia-smi replay stand-in) and one that fails at once.

What a user sees: the jobs page lists both with their states and follows the failure without a
reload; the running job's page shows its step advancing, its GPU chart drawn and redrawn, and
its node log following, without a reload; the failed job's page says why; the read-only
dashboard has no control that changes anything; on a non-loopback address nothing is shown
without the token; with --allow-actions, the job is cancelled from its page. Every page is
captured at desktop and phone sizes (into $ORCH_SCREENSHOTS when set).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.support.browser import DESKTOP, NARROW, Browser, open_browser
from tests.support.dashboard_run import DashboardProcess, namespace_address
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    install_gpu_stand_in,
    job_json,
    orch_env,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

FAILURE = "the learning rate schedule is missing"
PAGES = ("/", "/clusters", "/cost")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    base = tmp_path_factory.mktemp("dashboard")
    work = counter_workdir(base)
    (work / "fail.py").write_text(f"import sys\nprint({FAILURE!r}, file=sys.stderr)\nsys.exit(3)\n")
    node_bin = base / "node-bin"
    install_gpu_stand_in(node_bin, json.dumps({"mode": "normal", "gpus": [[87, 30000, 81559]]}))
    specs = {
        "counter": f"run: {counter_run(600, step_s=0.3)}\nbudget: {{max_cost_usd: 5.00}}\n",
        "broken": "run: python fail.py\n",
    }
    home = base / "orch"
    env = orch_env(
        home, ORCH_WATCH_INTERVAL="1", ORCH_GPU_SAMPLE_EVERY="1", ORCH_LOCAL_PRICE_PER_HOUR="0.36"
    )
    ids = {}
    for name, body in specs.items():
        spec = base / f"{name}.yaml"
        spec.write_text(
            f"name: {name}\nworkdir: {work}\ndata: [{{src: {node_bin}, dst: ~/bin}}]\n"
            f"resources: {{nodes: 1, gpus_per_node: 1}}\n{body}"
        )
        submitted = run_orch(["submit", str(spec), "--detach"], env, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        ids[name] = submitted.stdout.split()[-1]
    try:
        wait_for_state(ids["counter"], env, {"RUNNING"}, timeout=180)
        yield {"base": base, "home": home, "env": env, **ids}
    finally:
        run_orch(["cancel", ids["counter"]], env, timeout=120)
        run_orch(["down", "--all"], env, timeout=120)


@pytest.fixture(scope="module")
def dashboard(jobs: dict) -> Iterator[DashboardProcess]:
    with DashboardProcess(jobs["home"]) as served:
        yield served


def mark_page(browser: Browser) -> None:
    """A mark a reload would wipe: the page is still the one loaded while it is there."""
    browser.driver.execute_script("window.orchTestMark = 'loaded once';")


def still_marked(browser: Browser) -> bool:
    return browser.driver.execute_script("return window.orchTestMark") == "loaded once"


def row_state(browser: Browser, job_id: str) -> str:
    return next(iter(browser.attributes(f'tr[data-job-id="{job_id}"]', "data-state")), "") or ""


def capture(browser: Browser, name: str) -> None:
    """The page at desktop size, then at a phone's, then back; once its pictures are drawn."""
    wait_until(
        lambda: browser.driver.execute_script(
            "return [...document.images].every(i => i.complete && i.naturalWidth > 0)"
        ),
        f"the pictures of {name} drawn", 60,
    )  # fmt: skip
    browser.screenshot(f"{name}-desktop")
    browser.set_size(*NARROW)
    browser.screenshot(f"{name}-narrow")
    browser.set_size(*DESKTOP)


def test_the_jobs_page_lists_the_jobs_and_follows_the_failure_without_a_reload(
    jobs: dict, dashboard: DashboardProcess, browser: Browser
) -> None:
    browser.get(dashboard.url)
    mark_page(browser)
    assert row_state(browser, jobs["counter"]) == "RUNNING"
    wait_until(lambda: row_state(browser, jobs["broken"]) == "FAILED", "the failure listed", 180)
    assert still_marked(browser)
    ids = browser.attributes("tr[data-job-id]", "data-job-id")
    assert ids == [jobs["broken"], jobs["counter"]]  # `orch status`'s order: newest first
    assert browser.console_errors() == []
    capture(browser, "jobs")


def test_a_running_jobs_page_shows_its_step_chart_and_log_advancing_without_a_reload(
    jobs: dict, dashboard: DashboardProcess, browser: Browser
) -> None:
    browser.get(f"{dashboard.url}jobs/{jobs['counter']}")
    mark_page(browser)
    first_step = int(browser.text("#step") or 0)
    first_chart = browser.driver.find_element(By.ID, "chart-gpu").get_attribute("src")
    browser.wait_text("#step", lambda text: text.isdigit() and int(text) > first_step + 2, 60)
    wait_until(
        lambda: browser.driver.find_element(By.ID, "chart-gpu").get_attribute("src") != first_chart,
        "the GPU chart redrawn", 60,
    )  # fmt: skip
    chart = browser.driver.find_element(By.ID, "chart-gpu")
    assert browser.driver.execute_script("return arguments[0].naturalWidth", chart) > 0
    with urllib.request.urlopen(chart.get_attribute("src"), timeout=30) as reply:
        svg = reply.read().decode()
    assert "node 0 GPU 0" in svg  # the replayed GPU's line, as `orch report` labels it
    browser.wait_text("#log", lambda text: '"step"' in text, 60)
    assert still_marked(browser)
    assert browser.console_errors() == []
    capture(browser, "job-running")


def test_a_failed_jobs_page_says_why(
    jobs: dict, dashboard: DashboardProcess, browser: Browser
) -> None:
    failed = wait_for_state(jobs["broken"], jobs["env"], {"FAILED"}, timeout=180)
    browser.get(f"{dashboard.url}jobs/{jobs['broken']}")
    reason = browser.text("#reason")
    assert failed["reason"] and failed["reason"].splitlines()[0] in reason
    assert "exit code" in reason
    capture(browser, "job-failed")


def test_the_read_only_dashboard_has_no_control_that_changes_anything(
    jobs: dict, dashboard: DashboardProcess, browser: Browser
) -> None:
    for path in (*PAGES, f"/jobs/{jobs['counter']}", f"/jobs/{jobs['broken']}", "/jobs/nope"):
        browser.get(dashboard.url.rstrip("/") + path)
        forms = browser.driver.find_elements(By.TAG_NAME, "form")
        assert all((form.get_attribute("method") or "get").lower() == "get" for form in forms)
        buttons = [b.text for b in browser.driver.find_elements(By.TAG_NAME, "button")]
        assert buttons in ([], ["Filter"]), (path, buttons)
        if path in PAGES:
            capture(browser, path.strip("/") or "home")
        if path == "/clusters":  # what runs where: the running job's node, with its price
            assert jobs["counter"] in browser.text("#nodes") and "$0.3600" in browser.text("#nodes")
    capture(browser, "not-found")
    # and the server has no such route: a hand-made POST from the page changes nothing
    status = browser.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"fetch('/jobs/{jobs['counter']}/cancel', {{method: 'POST'}}).then(r => done(r.status));"
    )
    assert status in (404, 405)
    assert job_json(jobs["counter"], jobs["env"])["state"] == "RUNNING"


def test_off_loopback_nothing_is_shown_without_the_token(jobs: dict, tmp_path: Path) -> None:
    with namespace_address() as link, DashboardProcess(jobs["home"], link=link) as remote:
        assert remote.token and remote.token in (jobs["home"] / "dashboard-token").read_text()
        with open_browser(tmp_path, allow=[link.address]) as browser:
            browser.get(remote.url)
            assert "needs its token" in browser.text("body")
            assert jobs["counter"] not in browser.driver.page_source
            browser.get(f"{remote.url}?token={remote.token}")
            wait_until(lambda: row_state(browser, jobs["counter"]) == "RUNNING", "the jobs", 30)
            assert "token=" not in browser.driver.current_url  # the address no longer holds it
            browser.get(f"{remote.url}jobs/{jobs['counter']}")  # the cookie carries it now
            assert browser.text("#step")


def test_with_actions_allowed_the_job_is_cancelled_from_its_page(
    jobs: dict, browser: Browser
) -> None:
    with DashboardProcess(jobs["home"], allow_actions=True) as acting:
        browser.get(f"{acting.url}jobs/{jobs['counter']}")
        mark_page(browser)
        browser.driver.find_element(By.ID, "cancel").click()
        browser.driver.switch_to.alert.accept()  # "Cancel job ...?"
        wait_until(lambda: "asked=cancel" in browser.driver.current_url, "the cancel asked", 30)
        browser.wait_text("#state", lambda text: "CANCELLED" in text, 120)
    assert job_json(jobs["counter"], jobs["env"])["state"] == "CANCELLED"
