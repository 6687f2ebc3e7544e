"""The typed rows the ledger's read model (`ledger.view`) gives, and every job's bill from its
leases (`bills_of`): plain frozen dataclasses with the names and Python types of the SQLModel
models' columns (store.py), so the documents built from either are the same."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol

from orchestrator.ledger.measures import Billed, lease_cost


@dataclass(frozen=True, slots=True)
class JobRow:
    """A `store.Job` without its spec and controller bookkeeping."""

    id: str
    name: str
    state: str
    provider: str
    nodes: int
    gpus_per_node: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    step: int | None
    loss: float | None
    exit_code: int | None
    reason: str | None
    recoveries: int
    switches: int
    cluster_id: str | None
    controller: str | None
    owner: str | None  # who submitted it (`Settings.owner_label`): a label, not a proof

    @property
    def node_owner(self) -> str:
        """`store.Job.node_owner`: the id the job's nodes are tagged, keyed and laid out by."""
        return self.cluster_id or self.id


@dataclass(frozen=True, slots=True)
class JobDetailRow(JobRow):
    """A `store.Job` with its spec (the validated JobSpec as JSON): one job's view."""

    spec_json: str


@dataclass(frozen=True, slots=True)
class EventRow:
    """A `store.Event`."""

    id: int
    job_id: str
    at: datetime
    kind: str
    message: str
    step: int | None


@dataclass(frozen=True, slots=True)
class GpuSampleRow:
    """A `store.GpuSampleRecord`."""

    id: int
    job_id: str
    rank: int
    gpu: int
    at: datetime
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    ok: bool


@dataclass(frozen=True, slots=True)
class ProgressSampleRow:
    """A `store.ProgressSampleRecord`."""

    id: int
    job_id: str
    at: datetime
    step: int
    epoch: float | None
    loss: float | None
    lr: float | None
    img_s: float | None


@dataclass(frozen=True, slots=True)
class ControllerLeaseRow:
    """What judging a `store.ControllerLease` reads: whose machine holds it, until when."""

    job_id: str
    machine: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A `store.Lease`."""

    id: int
    job_id: str
    cluster: str
    provider: str
    instance_id: str
    rank: int
    market: str
    instance_type: str
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class HostLeaseRow:
    """A `store.HostLease`: a launched controller host's billable life."""

    instance_id: str
    provider: str
    host: str
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class SpanRow:
    """What a bill reads of a `store.Lease`: whose it is, its price and its span."""

    job_id: str
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobBill:
    """A job's bill from its leases: how many, their node-seconds, what they cost (exact USD),
    and whether one of them still bills."""

    leases: int
    node_seconds: float
    spend: Decimal
    running: bool


NO_BILL = JobBill(0, 0.0, Decimal(0), False)


class JobSpan(Billed, Protocol):
    """A lease's span with its job: a `SpanRow`, `LeaseRow` or `store.Lease`."""

    @property
    def job_id(self) -> str: ...


def bills_of(spans: Iterable[JobSpan], now: datetime) -> dict[str, JobBill]:
    """Each job's bill from its leases' spans, at `now` (a lease still open bills until then),
    with `measures.lease_cost`'s arithmetic. Anything with a lease's job, price and span
    will do (`SpanRow`, `LeaseRow`, `store.Lease`)."""
    count: dict[str, int] = {}
    seconds: dict[str, float] = {}
    spend: dict[str, Decimal] = {}
    running: dict[str, bool] = {}
    for span in spans:
        job = span.job_id
        count[job] = count.get(job, 0) + 1
        seconds[job] = (
            seconds.get(job, 0.0) + ((span.ended_at or now) - span.launched_at).total_seconds()
        )
        spend[job] = spend.get(job, Decimal(0)) + lease_cost(span, now)
        running[job] = running.get(job, False) or span.ended_at is None
    return {job: JobBill(count[job], seconds[job], spend[job], running[job]) for job in count}


@dataclass(frozen=True, slots=True)
class IdleLeaseRow:
    """A `store.IdleLease`."""

    id: int
    cluster_id: str
    instance_id: str
    rank: int
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class ClusterRow:
    """A `store.KeptCluster`."""

    id: str
    name: str
    provider: str
    state: str
    nodes: int
    gpus_per_node: int
    autostop_s: float | None
    created_at: datetime
    ended_at: datetime | None
    job_id: str | None
    idle_since: datetime | None
    reason: str | None
    machine: str | None  # the machine id of the ORCH_HOME that made it, its owner


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """A `store.CheckpointRecord`."""

    id: int
    job_id: str
    name: str
    step: int | None
    size_bytes: int
    pulled_at: datetime
    kind: str | None
    digest: str | None
    in_mirror: bool
    stored_at: datetime | None
    store_url: str | None
    files_json: str | None
    pruned_at: datetime | None
