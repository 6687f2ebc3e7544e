"""The controller's check scheduler: a check that outlasts its interval is not a line a turn."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from orchestrator.control.run.watching import check_scheduler


def test_a_slow_check_runs_once_at_a_time_and_its_skipped_turns_are_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, most, runs = [0], [0], [0]
    lock = threading.Lock()

    def slow_check() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.6)  # on purpose: longer than the interval, so that runs would overlap
        with lock:
            running[0] -= 1
            runs[0] += 1

    scheduler = check_scheduler()
    scheduler.add_job(slow_check, "interval", seconds=0.1)
    with caplog.at_level(logging.DEBUG):
        scheduler.start()
        time.sleep(1.5)  # on purpose: time for several intervals to pass
        scheduler.shutdown(wait=True)
        logging.getLogger("orchestrator.control.checks").warning("another warning")
    assert runs[0] >= 1 and most[0] == 1
    said = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert said == ["another warning"], said
