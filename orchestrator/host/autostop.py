"""When an idle controller host stops itself: a pure decision, tested without a host.

The host is idle while it drives no unfinished job. `IdleClock` remembers since when; once that
lasts `autostop_s` the host stops (the daemon exits, and a launched host powers its machine off,
which is when its billing stops). Any unfinished job resets the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.job_state import JobState


def unfinished(jobs: Iterable[Mapping[str, object]]) -> list[str]:
    """Ids of the jobs (`orch status --json`'s `jobs`) that are not in a final state."""
    ids = []
    for job in jobs:
        try:
            final = JobState(str(job.get("state"))).is_final
        except ValueError:
            final = False  # a state this version does not know: assume it still runs
        if not final:
            ids.append(str(job.get("id")))
    return ids


@dataclass(frozen=True)
class IdleClock:
    """Since when (a monotonic or epoch second) the host has had no job; None: it has one."""

    autostop_s: float  # idle time before the host stops; 0 or less: never
    idle_since: float | None

    def tick(self, now: float, jobs: int) -> IdleClock:
        """The clock after seeing `jobs` unfinished jobs at `now`."""
        if jobs:
            return IdleClock(self.autostop_s, None)
        return IdleClock(self.autostop_s, now if self.idle_since is None else self.idle_since)

    def remaining(self, now: float) -> float | None:
        """Seconds left before the host stops (None: it drives a job, or autostop is off)."""
        if self.idle_since is None or self.autostop_s <= 0:
            return None
        return max(0.0, self.autostop_s - (now - self.idle_since))

    def should_stop(self, now: float) -> bool:
        return self.remaining(now) == 0.0
