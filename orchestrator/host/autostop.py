"""When an idle controller host stops itself: a pure decision, tested without a host.

The host is idle while it drives no unfinished job. `IdleClock` remembers since when; once that
lasts `autostop_s` the host stops (the daemon exits, and a launched host powers its machine off,
which is when its billing stops). Any unfinished job resets the clock.

The dead-man rule: the host knows its jobs only from a look that works (`orch status` there).
While looks fail (a broken ledger, a team database out of reach, an orch that crashes), the jobs
of the last look that worked keep it busy for `deadman_s` after that look at most; then it counts
as idle from that moment, and its autostop follows as for any idle host. So a host whose orch
cannot list its jobs stops at most `deadman_s + autostop_s` after its last look that worked (or
after the daemon started, when none did). A look that works again sets the clock by what it
shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.job_state import JobState

DEFAULT_DEADMAN_S = 3600.0  # how long failed looks may keep a host busy


def unfinished(jobs: Iterable[Mapping[str, object]]) -> list[str]:
    """Ids of the jobs (`orch status --json`'s `jobs`) that are not in a final state."""
    return [str(job.get("id")) for job in jobs if not _final(job.get("state"))]


def finished(jobs: Iterable[Mapping[str, object]]) -> list[str]:
    """Ids of the jobs (`orch status --json`'s `jobs`) that are in a final state."""
    return [str(job.get("id")) for job in jobs if _final(job.get("state"))]


def _final(state: object) -> bool:
    try:
        return JobState(str(state)).is_final
    except ValueError:
        return False  # a state this version does not know: assume it still runs


@dataclass(frozen=True)
class IdleClock:
    """Since when (a monotonic or epoch second) the host has had no job; None: it has one.
    `seen_at`: when a look at its jobs last worked (or the daemon started)."""

    autostop_s: float  # idle time before the host stops; 0 or less: never
    idle_since: float | None
    seen_at: float = 0.0  # time of the last look at the jobs that worked
    deadman_s: float = DEFAULT_DEADMAN_S  # how long failed looks may keep the host busy

    def tick(self, now: float, jobs: int) -> IdleClock:
        """The clock after a look at `now` that worked and saw `jobs` unfinished jobs."""
        since = None if jobs else (now if self.idle_since is None else self.idle_since)
        return IdleClock(self.autostop_s, since, now, self.deadman_s)

    def blind(self, now: float) -> IdleClock:
        """The clock after a look at `now` that failed: the last look's jobs keep the host
        busy until `seen_at + deadman_s`, and it is idle from then on (the dead-man rule)."""
        if self.idle_since is not None or now - self.seen_at < self.deadman_s:
            return self
        return IdleClock(self.autostop_s, self.seen_at + self.deadman_s, self.seen_at,
                         self.deadman_s)  # fmt: skip

    def blind_for(self, now: float) -> float:
        """Seconds since the last look at the jobs that worked."""
        return max(0.0, now - self.seen_at)

    def remaining(self, now: float) -> float | None:
        """Seconds left before the host stops (None: it drives a job, or autostop is off)."""
        if self.idle_since is None or self.autostop_s <= 0:
            return None
        return max(0.0, self.autostop_s - (now - self.idle_since))

    def should_stop(self, now: float) -> bool:
        return self.remaining(now) == 0.0
