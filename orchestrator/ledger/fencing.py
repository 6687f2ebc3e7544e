"""Fencing: a controller's writes about its job, each conditional on holding the job's
controller lease (`ledger.controller_leases`), checked in the transaction of the write.

A `Fence` is the lease as its controller took it: the holder ("machine:pid") and `taken_at`.
Every take by another holder (an expired lease taken over, `take(force=True)`) puts another
holder in the row; a release removes the row; a re-take by the same holder keeps both. So the
row is the fence's exactly while nobody else took the lease since.

A fenced `Ledger` (`Ledger.fenced`) opens each write transaction with an UPDATE of the lease
row that matches only while the row is the fence's. That statement locks the row (PostgreSQL)
or the database (SQLite) until the transaction ends, so a take-over commits either before the
check (the write is refused, nothing of it written) or after the write has committed. Before
an action outside the ledger (a provider's terminate) the controller checks its fence the same
way, in a transaction of its own that also renews the lease for its length
(`Ledger.hold_fence`): the action follows the check at once, and no controller may take the
lease over by expiry for a lease's length after the check.

A fence found lost calls the fence's `on_lost` (the controller's: a LEASE_LOST event, then the
process ends) and raises `LeaseLost`; nothing of the refused write is in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Table, update
from sqlalchemy.engine import Connection

from orchestrator.errors import OrchError
from orchestrator.ledger.clock import database_now


@dataclass(frozen=True)
class Fence:
    """The controller lease of job `job_id` as its holder took it."""

    job_id: str
    holder: str  # "machine:pid" of the controller that took it
    taken_at: datetime | None  # when it took it (the ledger's clock); None: recorded without
    length_s: float  # the lease's length: a check before a terminate renews it for this long
    # called with why, once a write or a check found the lease another's (before LeaseLost)
    on_lost: Callable[[str], None] | None = field(default=None, compare=False)


class LeaseLost(OrchError):
    """A fenced write or check found that the controller no longer holds its job's lease:
    another controller took it. Nothing was written; the caller must stop driving the job."""


def lost_reason(fence: Fence, holder: str | None, machine: str | None, doing: str) -> str:
    """Why a fence failed, e.g. "its lease is held by b:12 (machine b) now, found as it was
    about to write the job's state"."""
    found = f"found as it was about to {doing}"
    if holder is None:
        return f"its lease was released by its next holder, {found}"
    if holder == fence.holder:
        return f"its lease was taken again since it took it, {found}"
    return f"its lease is held by {holder} (machine {machine}) now, {found}"


def claim(connection: Connection, leases: Table, fence: Fence, *, renew: bool) -> bool:
    """Whether the row of `leases` (the controller lease table) is still `fence`'s, locking
    it until `connection`'s transaction ends: an UPDATE that changes nothing, or with `renew`
    extends the lease for the fence's length from now (the ledger's clock)."""
    taken = leases.c.taken_at
    token = taken.is_(None) if fence.taken_at is None else taken == fence.taken_at
    values: dict[str, object] = {"holder": leases.c.holder}
    if renew:
        now = database_now(connection)
        values = {"renewed_at": now, "expires_at": now + timedelta(seconds=fence.length_s)}
    result = connection.execute(
        update(leases)
        .where(leases.c.job_id == fence.job_id, leases.c.holder == fence.holder, token)
        .values(**values)
    )
    return result.rowcount == 1
