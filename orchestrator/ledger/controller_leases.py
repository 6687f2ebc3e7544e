"""Controller leases in the ledger: on a ledger several machines share, the one controller
allowed to drive each job (`ControllerLease`, one row per job).

A lease is taken in one transaction: inserted when the job has none, or taken over when it
expired, is already this holder's, or is held by a dead process of this same machine (the
caller knows: it holds the job's controller lock in that machine's ORCH_HOME). The take-over
is a compare-and-set on the row as it was read (holder and expiry), so of two controllers
racing for one job exactly one wins, on SQLite and PostgreSQL alike. A holder renews its
lease before it expires; a renewal that finds another holder has lost the lease.

Times are the ledger's clock (`ledger.clock`), read in the transaction that uses them: a lease
is taken, renewed and judged expired by one clock, whatever the machines' clocks say.

Another machine may ask the holder to cancel the job (`ask_cancel`): the request is kept on
the lease row, which the holder reads back at every renewal, and stays there for whoever
holds the lease next until the job ends or the asker withdraws it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from orchestrator.ledger.clock import database_now
from orchestrator.ledger.store import ControllerLease, Ledger

_TABLE = ControllerLease.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class LeaseClaim:
    """What a `take` found: whether the caller holds the lease now, and the lease as it is
    (the caller's, or the live one of another holder; None when the job has none)."""

    taken: bool
    lease: ControllerLease | None
    previous: ControllerLease | None = None  # the lease taken over: expired, dead, or forced

    def forced_from(self, machine: str) -> ControllerLease | None:
        """The lease this claim took from a live holder on another machine than `machine`
        (only `take(force=True)` takes one); None otherwise."""
        previous, taken = self.previous, self.lease
        if not self.taken or previous is None or taken is None or previous.machine == machine:
            return None
        return previous if previous.expires_at > taken.renewed_at else None


class ControllerLeases:
    """Reads and writes of the ledger's controller leases; one short transaction per call."""

    def __init__(self, ledger: Ledger) -> None:
        self.engine = ledger.engine

    def get(self, job_id: str) -> ControllerLease | None:
        with Session(self.engine) as session:
            return session.get(ControllerLease, job_id)

    def all(self) -> dict[str, ControllerLease]:
        """Every job's lease, by job id."""
        with Session(self.engine) as session:
            rows = session.execute(select(ControllerLease)).scalars()
            return {row.job_id: row for row in rows}

    def now(self) -> datetime:
        """The ledger's clock (`ledger.clock`): the time leases are judged by."""
        with self.engine.connect() as connection:
            return database_now(connection)

    def take(
        self,
        job_id: str,
        holder: str,
        machine: str,
        *,
        length_s: float,
        dead_on_this_machine: bool = False,
        force: bool = False,
    ) -> LeaseClaim:
        """Take job `job_id`'s lease for `holder` (of machine `machine`) for `length_s` from
        now (the ledger's clock), if the job has none, or its lease expired, or is `holder`'s
        already, or (`dead_on_this_machine`: the caller holds the job's controller lock on
        `machine`, so no other process of it drives the job) is another process's of
        `machine`. With `force`, a live lease of another holder is taken over too (that
        holder stops at its next renewal); the claim's `previous` is the lease it had."""
        try:
            with self.engine.begin() as connection:
                now = database_now(connection)
                values = self._held(holder, machine, now, length_s)
                row = connection.execute(select(_TABLE).where(_TABLE.c.job_id == job_id)).first()
                if row is None:
                    connection.execute(insert(_TABLE).values(job_id=job_id, **values))
                    return LeaseClaim(True, ControllerLease(job_id=job_id, **values))
                seen = ControllerLease(**row._asdict())
                free = (
                    force
                    or seen.holder == holder
                    or seen.expires_at <= now
                    or (dead_on_this_machine and seen.machine == machine)
                )
                if not free:
                    return LeaseClaim(False, seen)
                if seen.holder == holder:
                    values["taken_at"] = seen.taken_at
                swapped = connection.execute(
                    update(_TABLE)
                    .where(
                        _TABLE.c.job_id == job_id,
                        _TABLE.c.holder == seen.holder,
                        _TABLE.c.expires_at == seen.expires_at,
                    )
                    .values(**values)
                )
                if swapped.rowcount == 1:
                    previous = None if seen.holder == holder else seen
                    taken = ControllerLease(**{**row._asdict(), "job_id": job_id, **values})
                    return LeaseClaim(True, taken, previous)
        except IntegrityError:
            pass  # another holder inserted it first
        return LeaseClaim(False, self.get(job_id))  # another holder swapped it first

    @staticmethod
    def _held(holder: str, machine: str, now: datetime, length_s: float) -> dict[str, object]:
        expires = now + timedelta(seconds=length_s)
        return {"holder": holder, "machine": machine, "renewed_at": now, "expires_at": expires,
                "taken_at": now}  # fmt: skip

    def renew(self, job_id: str, holder: str, *, length_s: float) -> ControllerLease | None:
        """Extend `holder`'s lease of job `job_id` to `length_s` from now (the ledger's
        clock); the lease as renewed (with any cancel asked of it), or None when it is not
        `holder`'s any more (taken over, or removed)."""
        with self.engine.begin() as connection:
            now = database_now(connection)
            result = connection.execute(
                update(_TABLE)
                .where(_TABLE.c.job_id == job_id, _TABLE.c.holder == holder)
                .values(renewed_at=now, expires_at=now + timedelta(seconds=length_s))
            )
            if result.rowcount != 1:
                return None
            return _read(connection, job_id)

    def ask_cancel(self, job_id: str, by: str) -> ControllerLease | None:
        """Ask the live holder of job `job_id`'s lease to cancel the job, on behalf of `by`
        ("machine:pid"); the lease as asked, or None when the job has no live lease (nobody
        to ask)."""
        with self.engine.begin() as connection:
            now = database_now(connection)
            result = connection.execute(
                update(_TABLE)
                .where(_TABLE.c.job_id == job_id, _TABLE.c.expires_at > now)
                .values(cancel_by=by, cancel_at=now)
            )
            return _read(connection, job_id) if result.rowcount == 1 else None

    def withdraw_cancel(self, job_id: str, by: str) -> bool:
        """Withdraw the cancel `by` asked of job `job_id`'s lease; False when it is not
        there any more (the lease ended, or another asked since)."""
        with self.engine.begin() as connection:
            result = connection.execute(
                update(_TABLE)
                .where(_TABLE.c.job_id == job_id, _TABLE.c.cancel_by == by)
                .values(cancel_by=None, cancel_at=None)
            )
            return result.rowcount == 1

    def release(self, job_id: str, holder: str) -> bool:
        """Remove `holder`'s lease of job `job_id` (its controller is done with the job);
        False when it was not `holder`'s."""
        with self.engine.begin() as connection:
            result = connection.execute(
                delete(_TABLE).where(_TABLE.c.job_id == job_id, _TABLE.c.holder == holder)
            )
            return result.rowcount == 1


def _read(connection: Connection, job_id: str) -> ControllerLease | None:
    row = connection.execute(select(_TABLE).where(_TABLE.c.job_id == job_id)).first()
    return None if row is None else ControllerLease(**row._asdict())
