"""A start that made no progress within `recovery.start_timeout` (the supervisor's
`FailedStart`): what the nodes said is written as an event, the run is restarted on the same
nodes (`start_rules.SAME_NODE_RESTARTS` times), and a start that fails again fails the job
with the reason that names the hang."""

from __future__ import annotations

from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.launcher import Launcher
from orchestrator.control.run.start_rules import SAME_NODE_RESTARTS, FailedStart, may_restart
from orchestrator.errors import JobFailed
from orchestrator.job_state import JobState
from orchestrator.node.launch import NodeLayout

START_FAILED_EVENT = "START_FAILED"


class SameNodeRestarts:
    """Counts the failed starts in a row of one job's runner, and restarts or fails them."""

    def __init__(self, journal: Journal, layout: NodeLayout, launcher: Launcher) -> None:
        self.journal = journal
        self.layout = layout
        self.launcher = launcher
        self.failed = 0  # failed starts in a row: any other decision ends the streak

    def other_decision(self) -> None:
        """The run made progress since (the supervisor decided something else)."""
        self.failed = 0

    def restart(self, attempt: Attempt, failed: FailedStart) -> StopOrder | None:
        """Write what the nodes said, then restart the run on the same nodes (RECOVERING, then
        RUNNING; no node is launched or ended, no recovery counted) and return None; once the
        restarts are used up, the order that fails the job."""
        journal = self.journal
        journal.event(
            START_FAILED_EVENT, f"{failed.reason}; last lines: {failed.details or 'none read'}",
            step=journal.last_step,
        )  # fmt: skip
        if not may_restart(self.failed):
            return StopOrder(
                JobState.FAILED, JobFailed.exit_code,
                f"{failed.reason}; the same after {self.failed} restart(s) on the same nodes",
            )  # fmt: skip
        self.failed += 1
        journal.recovering(
            f"restart {self.failed} of {SAME_NODE_RESTARTS} on the same nodes: the start made "
            "no progress", recoveries=journal.job.recoveries,
        )  # fmt: skip
        attempt.clear_runs(self.layout, range(len(attempt.instances)))
        self.launcher.start(attempt)
        return None
