"""Open pages follow the ledger within 5 s, without a reload, in a real headless Chromium: a job's
step, state, events and GPU chart, and a new job in the jobs list. The ledger is written by the
test, as a controller writes it; the dashboard is served in the test's process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from orchestrator.config import Settings, load_settings
from orchestrator.job_state import JobState
from orchestrator.ledger.store import GpuSampleRecord, Ledger, make_engine, utcnow
from orchestrator.web.access import Access
from orchestrator.web.app import Dashboard
from tests.support.browser import Browser
from tests.support.dashboard_app import Served, served
from tests.support.in_process import isolated_home
from tests.support.ledger_rows import add_job, fill
from tests.support.waiting import wait_until

LIVE_BOUND_S = 5.0  # the bound: a page shows a ledger change within 5 s


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Served, Ledger]]:
    isolated_home(tmp_path, monkeypatch)
    settings: Settings = load_settings()
    ledger = Ledger(make_engine(settings.db_path))
    fill(ledger, tmp_path / "store")
    with served(Dashboard(settings, ledger, Access("127.0.0.1", 0, None))) as running:
        yield running, ledger


def within_bound(browser: Browser, check: object, what: str) -> float:
    """Seconds until `check()` holds, failing past `LIVE_BOUND_S`."""
    start = time.monotonic()
    wait_until(check, what, LIVE_BOUND_S, interval=0.1)  # type: ignore[arg-type]
    return time.monotonic() - start


def test_a_jobs_page_follows_its_step_state_events_and_gpu_chart(
    site: tuple[Served, Ledger], browser: Browser
) -> None:
    served_site, ledger = site
    browser.get(f"{served_site.url}/jobs/run-1")
    browser.driver.execute_script("window.orchTestMark = 1;")
    chart = browser.driver.find_element(By.ID, "chart-gpu").get_attribute("src")
    ledger.update_job("run-1", step=1234, loss=0.0625)
    within_bound(browser, lambda: browser.text("#step") == "1234", "the new step shown")
    assert browser.text("#loss") == "0.0625"
    ledger.add_gpu_samples([GpuSampleRecord(job_id="run-1", rank=0, gpu=0, at=utcnow(),
                                            util_pct=64.0, mem_used_mib=2048.0,
                                            mem_total_mib=16384.0)])  # fmt: skip
    within_bound(browser, lambda: "64 %" in browser.text("#gpus"), "the new GPU reading shown")

    def chart_drawn_at_the_pages_version() -> bool:
        version = browser.driver.find_element(By.ID, "live").get_attribute("data-version")
        src = browser.driver.find_element(By.ID, "chart-gpu").get_attribute("src") or ""
        return src != chart and src.endswith(f"v={version}")

    within_bound(browser, chart_drawn_at_the_pages_version, "the GPU chart redrawn")
    ledger.add_event("run-1", "PREEMPTED", "notice: node 0 (i-b0) is reclaimed in 120 s")
    ledger.update_job("run-1", state=JobState.RECOVERING)
    within_bound(browser, lambda: "RECOVERING" in browser.text("#state"), "the new state shown")
    assert "notice: node 0 (i-b0)" in browser.text("#events")
    assert browser.driver.execute_script("return window.orchTestMark") == 1  # never reloaded
    assert browser.console_errors() == []


def test_the_jobs_list_shows_a_new_job_and_a_new_state(
    site: tuple[Served, Ledger], browser: Browser
) -> None:
    served_site, ledger = site
    browser.get(served_site.url + "/")
    browser.driver.execute_script("window.orchTestMark = 1;")
    add_job(ledger, "fresh-1", JobState.PROVISIONING, 5000)
    within_bound(
        browser,
        lambda: browser.attributes('tr[data-job-id="fresh-1"]', "data-job-id"),
        "the new job listed",
    )
    ledger.update_job("fresh-1", state=JobState.FAILED, reason="no capacity")
    within_bound(
        browser,
        lambda: browser.attributes('tr[data-job-id="fresh-1"]', "data-state") == ["FAILED"],
        "the new state listed",
    )  # fmt: skip
    assert browser.driver.execute_script("return window.orchTestMark") == 1
