"""The one attempt a job's runner holds at a time, shared by whoever makes and ends it."""

from __future__ import annotations

from datetime import datetime

from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.ending import NodeEnder


class CurrentAttempt:
    """The job's current attempt (an empty one before the first launch and after an end).

    Whoever launches nodes (`Launcher`, `KeptNodes`) `hold`s them here the moment they exist,
    before their leases are written, so that whoever ends the job's nodes (the runner's
    teardown, a recovery) finds them whatever fails next.
    """

    def __init__(self, nodes: NodeEnder) -> None:
        self.attempt = Attempt.not_launched()
        self._nodes = nodes

    def hold(self, attempt: Attempt) -> None:
        """`attempt` is the job's current one from now."""
        self.attempt = attempt

    def let_go(self) -> None:
        """Close the attempt's connections and take a fresh, not-launched one; its nodes run
        on (survivors kept for a restart, a kept cluster's nodes)."""
        self.attempt.close()
        self.attempt = Attempt.not_launched()

    def end(self) -> datetime:
        """End every node of the attempt (and any other this ledger runs for the job), close
        its connections and take a fresh, not-launched attempt; returns when the provider says
        the nodes ended (their billing stopped)."""
        ended_at = self._nodes.terminate_all(self.attempt.instances)
        self.let_go()
        return ended_at
