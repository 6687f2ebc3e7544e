"""Ending a job's nodes: every node this ledger runs for the job, recorded or not, with the
ledger's writes about it best effort so that a ledger that refuses writes never keeps a node
billing."""

from __future__ import annotations

import contextlib
from datetime import datetime

from orchestrator.config import Settings
from orchestrator.control.process.ownership import partition
from orchestrator.control.run.end_nodes import hold_fence, lease_unrecorded
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter
from orchestrator.control.run.unrecorded import (
    LEDGER_FAILURES,
    DeferredWrites,
    UnrecordedEnd,
    save_unrecorded,
)
from orchestrator.errors import InstancesNotFound, OrchError
from orchestrator.ledger.store import utcnow
from orchestrator.providers.base import Instance, Provider


class NodeEnder:
    """Terminates the job's nodes and closes their leases.

    `writes` holds the best-effort ledger writes of a termination (and of the teardown around
    it); `unclosed` the leases whose end was not written, with the provider's end time.
    """

    def __init__(
        self,
        journal: Journal,
        provider: Provider,
        guards: Guards,
        reporter: Reporter,
        settings: Settings,
    ) -> None:
        self.journal = journal
        self.ledger = journal.ledger
        self.provider = provider
        self.guards = guards
        self.reporter = reporter
        self.settings = settings
        self.writes = DeferredWrites(reporter.line)
        self.unclosed: list[tuple[list[str], datetime]] = []

    def ours(self, instances: list[Instance]) -> list[Instance]:
        """Those of `instances` that are this ledger's
        (`orchestrator.control.process.ownership`)."""
        job_id = self.journal.job.id
        leased = {lease.instance_id for lease in self.ledger.leases(job_id)}
        return partition(instances, self.ledger.ledger_id, leased=leased).ours

    def warn(self, message: str) -> None:
        """A WARNING event, best effort (see `writes`)."""
        self.writes.write("a warning", lambda: self.journal.event("WARNING", message))

    def terminate_all(self, recorded: list[Instance]) -> datetime:
        """Terminate `recorded` and anything else of this ledger the provider runs for this
        job; returns when the provider says they ended (billing stopped).

        Ids the provider cannot find at all (`InstancesNotFound`) have their leases closed
        too: the runner checked that this controller acts as the job's identity, so the cloud
        forgot them (they ended long ago). The termination never waits on the ledger: its
        writes (leases of nodes launched without one, the leases' end, the event) are best
        effort (`writes`); a lease whose end was not written is kept in `unclosed` with the
        provider's end time. Nodes that powered themselves off are billed until they did.

        On a fenced ledger (a controller's, on a shared ledger) the controller lease is checked
        right before the provider is asked (`hold_fence`): a controller whose lease was taken
        ends nothing (`LeaseLost`, after its LEASE_LOST event).
        """
        job_id = self.journal.job.id
        ids = {i.instance_id for i in recorded}
        try:
            ids |= {lease.instance_id for lease in self.ledger.leases(job_id, open_only=True)}
        except LEDGER_FAILURES as exc:
            self.reporter.line(f"[orch] could not read the job's leases ({exc}); ending the rest")
        owned: list[Instance] = []
        try:
            owned = self.ours(self.provider.list_owned(job_id=self.journal.job.node_owner))
            ids |= {i.instance_id for i in owned}
        except OrchError as exc:
            self.warn(f"could not list nodes: {exc}")
        return self._end(ids, [*recorded, *owned])

    def terminate_these(self, ids: list[str], *, known: list[Instance]) -> datetime:
        """Terminate exactly the nodes `ids` (nodes lost from a run whose other nodes stay;
        `known`: those of them described) and close their leases; returns when the provider
        says they ended (billing stopped). The ledger's writes are best effort, as in
        `terminate_all`."""
        return self._end(set(ids), known)

    def _end(self, ids: set[str], known: list[Instance]) -> datetime:
        if not ids:
            return utcnow()
        job_id = self.journal.job.id
        # A launch cut short (a controller killed before it wrote the leases) left nodes that
        # bill without a lease: they get one before they end, so the bill holds their seconds.
        try:
            self.writes.write(
                "leases of nodes launched without one",
                lambda: lease_unrecorded(
                    self.ledger, self.provider, job_id, sorted(ids), known=known
                ),
            )
        except OrchError as exc:
            self.reporter.line(f"[orch] could not describe unleased nodes: {exc}")
        with contextlib.suppress(OrchError, *LEDGER_FAILURES):
            self.guards.close_self_ended(self.provider.self_ended(sorted(ids)))
        if self.writes.error is None:  # a ledger that refused a write is not waited on again
            hold_fence(self.ledger, len(ids), self.reporter.line)
        try:
            ended_at = self.provider.terminate(sorted(ids))
        except InstancesNotFound as exc:
            ended_at = exc.ended_at or utcnow()
            self.warn(f"{exc.message}; their leases end now")
        if not self.writes.write(
            f"the end of {len(ids)} lease(s) at {ended_at.isoformat()}",
            lambda: self.ledger.close_leases(ids, ended_at),
        ):
            self.unclosed.append((sorted(ids), ended_at))
        self.writes.write(
            "the TERMINATED event",
            lambda: self.journal.event("TERMINATED", f"{len(ids)} node(s)"),
        )
        return ended_at

    def save_unrecorded(self, record: UnrecordedEnd) -> None:
        """Keep what the ledger refused for `orch reconcile`, and say so."""
        ended = ", ".join(f"{' '.join(ids)} at {at.isoformat()}" for ids, at in record.ended)
        try:
            path = save_unrecorded(self.settings.home, record)
        except OSError as exc:
            self.reporter.line(
                f"[orch] could not save the unwritten records either ({exc}); the job ended "
                f"{record.state}, nodes ended: {ended or 'none'}"
            )
            return
        self.reporter.line(
            f"[orch] every node is ended; what the ledger refused is kept in {path}: "
            "`orch reconcile` writes it once the ledger takes writes again"
        )
