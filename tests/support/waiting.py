"""The one poller of the tests: wait until something holds, or fail saying what was awaited.

Every wait in the suite goes through `wait_until` (or `wait_for_job`, its ledger form), so a
timeout reads the same everywhere: what was awaited, for how long, and the last thing seen."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from orchestrator.ledger.store import Job, Ledger

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    what: str,
    timeout: float = 30.0,
    *,
    interval: float = 0.2,
    fail: Callable[[str], Exception] = AssertionError,
) -> T:
    """Call `check` every `interval` s until it returns something truthy, and return that.

    Past `timeout` s raises `fail(message)` naming `what` and the last value; an exception
    `check` raises (an assertion that the wait is pointless now) goes through at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise fail(f"timed out after {timeout:.0f} s waiting for {what}; last: {value!r}")
        time.sleep(interval)


def wait_for_job(
    ledger: Ledger,
    job_id: str,
    predicate: Callable[[Job], bool],
    what: str,
    timeout: float,
    *,
    interval: float = 0.1,
    stop_at: Collection[str] = (),
    fail: Callable[[str], Exception] = AssertionError,
) -> Job:
    """The job's ledger row once `predicate` holds (read straight from the ledger: no `orch`
    command in between, each would take a second or two). A job that reaches a state of
    `stop_at` first fails the wait at once with `fail`."""

    def ready() -> Job | None:
        job = ledger.get_job(job_id)
        if predicate(job):
            return job
        if job.state in stop_at:
            raise fail(f"{job_id} ended {job.state} while waiting for {what}: {job.reason}")
        return None

    return wait_until(ready, what, timeout, interval=interval, fail=fail)
