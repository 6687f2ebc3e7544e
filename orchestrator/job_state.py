"""A job's states and which may follow which; pure (no I/O, no persistence).

The ledger stores a job's state as its text; the runner writes every change through its
journal (`orchestrator.control.run.journal`), which refuses a change this table does not allow.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    SYNCING = "SYNCING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"  # nodes were lost (spot reclaim): replacing them, then resuming
    SWITCHING = "SWITCHING"  # spot policy: checkpoint, end the nodes, relaunch on the other market
    WAITING = "WAITING"  # spot policy: no node at all (nothing billed) until it says run
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    IDLE_STOPPED = "IDLE_STOPPED"
    TIMED_OUT = "TIMED_OUT"
    BUDGET_STOPPED = "BUDGET_STOPPED"
    STALLED = "STALLED"  # its step did not advance for budget.stall_timeout

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.IDLE_STOPPED,
        JobState.TIMED_OUT,
        JobState.BUDGET_STOPPED,
        JobState.STALLED,
    }
)

# Every non-final state may be followed by STOPPING (a job can be stopped at any point).
# A launch may start over from any state before RUNNING (a capacity refusal makes the spot
# policy decide again; a controller that finds a job PROVISIONING, SYNCING or RECOVERING starts
# it again). STOPPING may follow itself (a controller adopting a half-finished stop writes it
# again), and may be followed by a launch when it was recorded without its final state (a
# migrated ledger's job from before `stop_state`): it is started again, like one found
# PROVISIONING. RECOVERING may be followed by RUNNING: a start that made no progress is
# restarted on the same nodes.
_LAUNCH = frozenset({JobState.PROVISIONING, JobState.WAITING})
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: _LAUNCH,
    JobState.PROVISIONING: _LAUNCH | {JobState.SYNCING, JobState.RECOVERING},
    JobState.SYNCING: _LAUNCH | {JobState.RUNNING, JobState.RECOVERING},
    JobState.RUNNING: frozenset({JobState.RECOVERING, JobState.SWITCHING, JobState.WAITING}),
    JobState.RECOVERING: _LAUNCH | {JobState.RECOVERING, JobState.RUNNING},
    JobState.SWITCHING: _LAUNCH,
    JobState.WAITING: _LAUNCH,
    JobState.STOPPING: _LAUNCH | FINAL_STATES,
    **{state: frozenset() for state in FINAL_STATES},
}
TRANSITIONS = {
    state: nexts | ({JobState.STOPPING} if not state.is_final else set())
    for state, nexts in TRANSITIONS.items()
}


def may_follow(current: JobState, following: JobState) -> bool:
    """Whether a job in `current` may be put in `following`."""
    return following in TRANSITIONS[current]
