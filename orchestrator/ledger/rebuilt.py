"""Writing a job rebuilt from its running nodes into a ledger that never knew it.

A controller host's ledger (its own SQLite file) dies with the host. The next host rebuilds each
of its unfinished jobs from what outlived it: the job's record (the laptop's hand-over kit) and
its nodes, as the provider lists them by their tags. Those nodes carry the dead ledger's id, and
only nodes that carry a ledger's id are that ledger's to drive or end. So the new ledger takes
on the dead one's id, in the same transaction that writes the job's row, its leases and its
events: no reader ever sees the id without the job (which would make the nodes look leaked),
nor the job without the id (which would make them another ledger's).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session, select

from orchestrator.errors import LedgerError
from orchestrator.ledger.store import (
    LEDGER_ID_KEY,
    Event,
    IdleLease,
    Job,
    KeptCluster,
    Lease,
    Ledger,
    LedgerMeta,
)

REBUILT_EVENT = "REBUILT"  # the first event of a job rebuilt into a ledger that never knew it


class LedgerIdTaken(LedgerError):
    """The ledger holds rows of its own, under another id: it cannot take on a dead one's."""


def write_rebuilt_job(
    ledger: Ledger,
    job: Job,
    leases: Sequence[Lease],
    events: Sequence[Event],
    *,
    ledger_id: str | None,
) -> None:
    """Add `job`, `leases` and `events` in one transaction, taking on `ledger_id` (the id the
    job's nodes carry; None: they carry none, and the ledger keeps its own).

    Raises `LedgerIdTaken`, writing nothing, when the ledger has another id and already holds
    a job or a kept cluster (its own nodes carry that id); `LedgerError` when it knows `job`.
    """
    with Session(ledger.engine) as session:
        if session.get(Job, job.id) is not None:
            raise LedgerError(f"the ledger knows job {job.id} already: nothing to rebuild")
        if ledger_id is not None:
            meta = session.get(LedgerMeta, LEDGER_ID_KEY)
            if meta is None:
                session.add(LedgerMeta(key=LEDGER_ID_KEY, value=ledger_id))
            elif meta.value != ledger_id:
                if _holds_rows(session):
                    raise LedgerIdTaken(
                        f"job {job.id}'s nodes belong to ledger {ledger_id}, and this ledger "
                        f"({meta.value}) holds jobs of its own",
                        hint="hand the job over to a fresh host (`orch controller up` on a new "
                        "machine), or keep jobs in a team database (ledger.url) that outlives "
                        "its host",
                    )
                meta.value = ledger_id
                session.add(meta)
        session.add(job)
        session.flush()  # the job's row first: leases and events refer to it
        session.add_all([*leases, *events])
        session.commit()
    ledger.forget_cached_id()


def _holds_rows(session: Session) -> bool:
    return any(
        session.exec(select(model).limit(1)).first() is not None
        for model in (Job, KeptCluster, IdleLease)
    )
