"""Host leases in the ledger: the billable life of each controller host this ORCH_HOME launched
(`HostLease`, one row per host), its own line of the bill, billed to no job.

`open` is written right after the host's launch, before anything is installed on it (intent
first: a host that `up` leaves behind is billed all the same); `close` when its provider
acknowledged its end: `orch controller down` terminated it, `up` ended a dead one, or its
autostop powered it off (`close` then takes the time the provider kept). A lease is closed once:
a later `close` keeps the first end time. An adopted machine (`--host`) has no lease: orch does
not bill what it did not start.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import select, update
from sqlmodel import Session

from orchestrator.ledger.measures import total_cost
from orchestrator.ledger.store import HostLease, Ledger

_TABLE = HostLease.__table__  # type: ignore[attr-defined]


class HostLeases:
    """Reads and writes of the ledger's host leases; one short transaction per call."""

    def __init__(self, ledger: Ledger) -> None:
        self.engine = ledger.engine

    def open(self, lease: HostLease) -> None:
        """Record a launched host (idempotent: its row is kept as it is when present)."""
        with Session(self.engine) as session:
            if session.get(HostLease, lease.instance_id) is None:
                session.add(lease)
                session.commit()

    def close(self, instance_id: str, ended_at: datetime) -> None:
        """Its billing stopped at `ended_at` (UTC); a closed lease keeps its first end."""
        with Session(self.engine) as session:
            session.execute(
                update(_TABLE)
                .where(_TABLE.c.instance_id == instance_id, _TABLE.c.ended_at.is_(None))
                .values(ended_at=ended_at)
            )
            session.commit()

    def all(self) -> list[HostLease]:
        """Every host lease, the oldest first."""
        with Session(self.engine) as session:
            query = select(HostLease).order_by(_TABLE.c.launched_at)
            return list(session.execute(query).scalars())

    def open_ones(self) -> list[HostLease]:
        return [lease for lease in self.all() if lease.ended_at is None]


def host_spend(lease: HostLease, now: datetime) -> Decimal:
    """What the host cost from its launch to its end (or `now` while it runs), USD."""
    return total_cost([lease], now)
