"""A job's turn on its fleet: the queue of jobs waiting for a fleet's GPUs.

A launch on a fleet that has no room now (`FleetFull`) does not fail the job: the job waits in
the fleet's queue (WAITING, nothing billed; a `QUEUED` event with its position, and another
whenever the position changes) and tries again as soon as it is the first waiter that fits the
free GPUs, checked every `queue_poll_s`, so it starts within about that long of the blocking
job's end. The queue is in the ledger (`FleetBook.queue`): on a team ledger every member's jobs
wait in one line, and a later job may start first only while no earlier one fits (a 1-GPU job
is not held up behind an 8-GPU one that cannot start yet). A job that stops waiting (started,
cancelled, stopped by a cap while it waited) leaves the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter
from orchestrator.errors import FleetFull
from orchestrator.job_state import JobState
from orchestrator.ledger.fleets import FleetBook, FleetWaiter
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.ssh.placement import first_in_line

QUEUE_POLL_S = 0.5


class FleetTurn:
    """Launches on a fleet, waiting in its queue while it has no room."""

    def __init__(
        self,
        journal: Journal,
        reporter: Reporter,
        *,
        owner: str,
        poll_s: float = QUEUE_POLL_S,
    ) -> None:
        self.journal = journal
        self.reporter = reporter
        self.owner = owner
        self.poll_s = poll_s

    def launch(
        self, request: LaunchRequest, launch: Callable[[LaunchRequest], list[Instance]]
    ) -> list[Instance]:
        """`launch(request)` once the job's turn has come; returns its nodes. Raises what the
        launch raises but `FleetFull`; a cancel ends the wait as it ends any other."""
        assert request.fleet is not None
        book = FleetBook(self.journal.ledger)
        job_id = self.journal.job.id
        waiter = FleetWaiter(
            job_id=job_id,
            fleet=request.fleet,
            nodes=request.count,
            slots_per_node=request.gpus_per_node,
            owner=self.owner,
            since=datetime.now(UTC),
        )
        waited_since: float | None = None
        shown: tuple[int, int] | None = None
        try:
            while True:
                if self._my_turn(book, waiter):
                    try:
                        instances = launch(request)
                    except FleetFull as exc:
                        full = exc
                    else:
                        if waited_since is not None:
                            seconds = time.monotonic() - waited_since
                            self.journal.provisioning(
                                f"GPUs free on fleet {request.fleet} after {seconds:.0f} s in "
                                "its queue"
                            )
                        return instances
                else:
                    full = None
                if waited_since is None:
                    waited_since = time.monotonic()
                    book.wait(waiter)
                position = self._position(book, waiter)
                if position != shown:
                    shown = position
                    self._say(request.fleet, position, full)
                time.sleep(self.poll_s)
        finally:
            if waited_since is not None:
                book.stop_waiting(job_id)

    def _my_turn(self, book: FleetBook, waiter: FleetWaiter) -> bool:
        """Whether no earlier waiter that fits now stands before this job."""
        line = [(w.job_id, w.nodes, w.slots_per_node) for w in book.queue(waiter.fleet)]
        if waiter.job_id not in {entry[0] for entry in line}:
            line.append((waiter.job_id, waiter.nodes, waiter.slots_per_node))
        if line[0][0] == waiter.job_id:
            return True  # first in line: try, whatever the free GPUs (the launch decides)
        return first_in_line(line, book.host_slots(waiter.fleet)) == waiter.job_id

    def _position(self, book: FleetBook, waiter: FleetWaiter) -> tuple[int, int]:
        line = [w.job_id for w in book.queue(waiter.fleet)]
        if waiter.job_id not in line:
            line.append(waiter.job_id)
        return line.index(waiter.job_id) + 1, len(line)

    def _say(self, fleet: str, position: tuple[int, int], full: FleetFull | None) -> None:
        """WAITING the first time (its event says where the job stands), a QUEUED event
        whenever its position changes after that."""
        where, total = position
        message = f"queued on fleet {fleet}: position {where} of {total}"
        if full is not None:
            message += f" ({full.message})"
        if self.journal.job.state != JobState.WAITING:
            self.journal.waiting(message)
        else:
            self.journal.event("QUEUED", message)
        self.reporter.phase(message)
