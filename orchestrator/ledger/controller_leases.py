"""Controller leases in the ledger: on a ledger several machines share, the one controller
allowed to drive each job (`ControllerLease`, one row per job).

A lease is taken in one transaction: inserted when the job has none, or taken over when it
expired, is already this holder's, or is held by a dead process of this same machine (the
caller knows: it holds the job's controller lock in that machine's ORCH_HOME). The take-over
is a compare-and-set on the row as it was read (holder and expiry), so of two controllers
racing for one job exactly one wins, on SQLite and PostgreSQL alike. A holder renews its
lease before it expires; a renewal that finds another holder has lost the lease.

Times are the callers' UTC clocks: machines that share a ledger keep their clocks in sync
(NTP), well within a lease's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from orchestrator.ledger.store import ControllerLease, Ledger

_TABLE = ControllerLease.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class LeaseClaim:
    """What a `take` found: whether the caller holds the lease now, and the lease as it is
    (the caller's, or the live one of another holder; None when the job has none)."""

    taken: bool
    lease: ControllerLease | None
    previous: ControllerLease | None = None  # the lease taken over, if any (expired, or dead)


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

    def take(
        self,
        job_id: str,
        holder: str,
        machine: str,
        *,
        now: datetime,
        length_s: float,
        dead_on_this_machine: bool = False,
    ) -> LeaseClaim:
        """Take job `job_id`'s lease for `holder` (of machine `machine`) until `now` +
        `length_s`, if the job has none, or its lease expired, or is `holder`'s already, or
        (`dead_on_this_machine`: the caller holds the job's controller lock on `machine`, so
        no other process of it drives the job) is another process's of `machine`."""
        expires = now + timedelta(seconds=length_s)
        values = {"holder": holder, "machine": machine, "renewed_at": now, "expires_at": expires}
        try:
            with self.engine.begin() as connection:
                row = connection.execute(select(_TABLE).where(_TABLE.c.job_id == job_id)).first()
                if row is None:
                    connection.execute(insert(_TABLE).values(job_id=job_id, **values))
                    return LeaseClaim(True, ControllerLease(job_id=job_id, **values))
                seen = ControllerLease(**row._asdict())
                free = (
                    seen.holder == holder
                    or seen.expires_at <= now
                    or (dead_on_this_machine and seen.machine == machine)
                )
                if not free:
                    return LeaseClaim(False, seen)
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
                    return LeaseClaim(True, ControllerLease(job_id=job_id, **values), previous)
        except IntegrityError:
            pass  # another holder inserted it first
        return LeaseClaim(False, self.get(job_id))  # another holder swapped it first

    def renew(self, job_id: str, holder: str, *, now: datetime, length_s: float) -> bool:
        """Extend `holder`'s lease of job `job_id` to `now` + `length_s`; False when the
        lease is not `holder`'s any more (taken over, or removed)."""
        with self.engine.begin() as connection:
            result = connection.execute(
                update(_TABLE)
                .where(_TABLE.c.job_id == job_id, _TABLE.c.holder == holder)
                .values(renewed_at=now, expires_at=now + timedelta(seconds=length_s))
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
