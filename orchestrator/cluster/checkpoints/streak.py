"""When failed checkpoint collections should end a job: a pure rule over the run of failures.

One failed pull keeps the mirror as it was and is tried again with backoff; only a streak that
lasts (`limit_s` seconds and at least `min_failures` tries in a row) gives a reason to fail the
job, since training on would only pile up work that no copy keeps. The controller turns that
reason into its stop decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.backoff import backoff_s


@dataclass
class PullStreak:
    """Checkpoint collections that failed in a row (times are `time.monotonic()` seconds)."""

    failures: int = 0
    first_at: float | None = None
    last_error: str = ""

    def failed(self, now: float, error: str) -> None:
        self.failures += 1
        self.first_at = now if self.first_at is None else self.first_at
        self.last_error = error

    def succeeded(self) -> None:
        self.failures, self.first_at, self.last_error = 0, None, ""

    def retry_in(self, first_s: float, cap_s: float) -> float:
        """The wait before the next try: `first_s`, doubling with each failure, at most `cap_s`."""
        return backoff_s(self.failures, first_s, cap_s)


def pull_failure_reason(
    streak: PullStreak, *, now: float, limit_s: float, min_failures: int
) -> str | None:
    """Why the job must fail once collections have failed for `limit_s` seconds and at least
    `min_failures` times in a row; None while the streak is shorter (or there is none)."""
    if streak.first_at is None or streak.failures < min_failures:
        return None
    lasted = now - streak.first_at
    if lasted < limit_s:
        return None
    return (
        f"checkpoints could not be brought home for {lasted:.0f} s ({streak.failures} tries in "
        f"a row); last error: {streak.last_error}"
    )
