"""What ledger rows measure: a lease's cost, the hourly rate of open leases, a kept cluster's
time left before autostop and the job holding it. Functions of rows, whichever reader made
them (SQLModel's models in `store` and `clusters`, or the read-only sqlite3 view in `view`);
nothing heavy is imported, so the list views use them without SQLModel.

Money: prices are recorded per lease at launch time (USD per hour, exact decimals) and never
re-read from a catalog; spend = sum over leases of seconds x price / 3600.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol

from orchestrator.errors import OrchError
from orchestrator.job_state import JobState

UP, DOWN = "UP", "DOWN"  # a kept cluster's states


class Billed(Protocol):
    """A node's billable span: a job's lease or a kept cluster's idle lease."""

    @property
    def price_per_hour(self) -> Decimal: ...
    @property
    def launched_at(self) -> datetime: ...
    @property
    def ended_at(self) -> datetime | None: ...


class Autostopped(Protocol):
    """What a kept cluster's autostop depends on."""

    @property
    def autostop_s(self) -> float | None: ...
    @property
    def idle_since(self) -> datetime | None: ...


class Held(Protocol):
    """What says which job holds a kept cluster."""

    @property
    def job_id(self) -> str | None: ...


class HasState(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...


class JobLookup(Protocol):
    """A reader that finds a job by id, raising an OrchError when there is none."""

    def get_job(self, job_id: str) -> HasState: ...


def utcnow() -> datetime:
    return datetime.now(UTC)


def lease_cost(lease: Billed, now: datetime) -> Decimal:
    """What a lease has cost until it ended (or until `now` while it still runs)."""
    end = lease.ended_at or now
    seconds = max(Decimal(0), Decimal(str((end - lease.launched_at).total_seconds())))
    return seconds * lease.price_per_hour / Decimal(3600)


def total_cost(leases: Iterable[Billed], now: datetime) -> Decimal:
    return sum((lease_cost(lease, now) for lease in leases), Decimal(0))


def hourly_rate(leases: Iterable[Billed]) -> Decimal:
    """USD per hour the open ones of these leases bill together."""
    return sum((lease.price_per_hour for lease in leases if lease.ended_at is None), Decimal(0))


def autostop_left(cluster: Autostopped, now: datetime) -> float | None:
    """Seconds before an idle cluster's guards end it; None while a job holds it or with
    autostop never. Negative: past due (the guards act within one of their looks)."""
    if cluster.autostop_s is None or cluster.idle_since is None:
        return None
    return cluster.autostop_s - (now - cluster.idle_since).total_seconds()


def holder(ledger: JobLookup, cluster: Held) -> str | None:
    """The job that holds `cluster` now and is not final, if any."""
    if cluster.job_id is None:
        return None
    try:
        job = ledger.get_job(cluster.job_id)
    except OrchError:
        return None
    return None if JobState(job.state).is_final else job.id
