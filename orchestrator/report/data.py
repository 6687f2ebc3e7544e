"""What a job's report shows, computed from ledger rows: pure, no I/O, no plotting.

`build_report(job, leases, events, samples, now, progress)` turns the rows of one job into
- utilization series, one per (node, GPU) from the recorded samples (GPU index -1 holds the
  CPU use of the job's processes on a node without GPUs); an unknown reading is a gap (None);
  a node read by its CPU has no GPU series made only of unknown readings (an older orch
  recorded those before it knew the node had no GPU);
- GPU memory series, one per (node, GPU) of the same samples, MiB used and total (None where
  unknown), under the same rules: the CPU fallback has no memory, and a node read by its CPU
  has no GPU series whose utilization was never known;
- rank 0's progress (step, loss, throughput) at each watch check where the step moved;
- the spend curve: each lease bills its recorded price from `launched_at` to `ended_at`
  (or to `now` while open), leases overlap, so spend is piecewise linear with a corner at
  every launch and end, exact in Decimal at each corner and linear between them;
- the budget line (`budget.max_cost_usd` of the job's spec as recorded in the ledger);
- the events worth marking on a time axis (start, checkpoints, interruptions and recoveries,
  controller take-overs, how the job ended), and why a job that did not succeed ended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from orchestrator.job_state import JobState
from orchestrator.ledger.store import Event, GpuSampleRecord, Job, Lease, ProgressSampleRecord

CPU_GPU_INDEX = -1  # the GPU index under which a node's CPU fallback readings are stored

# Event kinds drawn as markers, and the category that decides how they look.
MARKED_EVENTS: dict[str, str] = {
    "RUNNING": "start",
    "CHECKPOINT": "checkpoint",
    "PREEMPTED": "interruption",
    "SALVAGED": "recovery",  # the emergency checkpoint pulled after an interruption
    "RECOVERING": "recovery",
    "RESUMED": "recovery",
    "ADOPTED": "controller",
    "REBUILT": "controller",  # written into a new host's ledger from the job's nodes
    "RESTARTED": "controller",
    **{state.value: "end" for state in JobState if state.is_final},
}


@dataclass(frozen=True)
class UtilSeries:
    """Readings of one GPU (or of a GPU-less node's job processes) over time."""

    node: int  # node rank
    gpu: int  # GPU index on the node; CPU_GPU_INDEX for the CPU fallback
    times: tuple[datetime, ...]
    values: tuple[float | None, ...]  # percent; None where the reading was unknown

    @property
    def is_cpu(self) -> bool:
        return self.gpu == CPU_GPU_INDEX

    @property
    def label(self) -> str:
        return f"node {self.node} CPU" if self.is_cpu else f"node {self.node} GPU {self.gpu}"

    @property
    def unknown_times(self) -> tuple[datetime, ...]:
        return tuple(t for t, v in zip(self.times, self.values, strict=True) if v is None)


@dataclass(frozen=True)
class MemorySeries:
    """GPU memory readings of one GPU over time, in MiB; None where the GPU gave none."""

    node: int  # node rank
    gpu: int  # GPU index on the node (never CPU_GPU_INDEX: the CPU fallback reads no memory)
    times: tuple[datetime, ...]
    used_mib: tuple[float | None, ...]
    total_mib: tuple[float | None, ...]

    @property
    def label(self) -> str:
        return f"node {self.node} GPU {self.gpu}"

    @property
    def known(self) -> bool:
        """Whether any reading says how much memory was used."""
        return any(value is not None for value in self.used_mib)


@dataclass(frozen=True)
class ProgressPoint:
    """Rank 0's progress as read at one watch check."""

    at: datetime
    step: int
    loss: float | None
    img_s: float | None  # throughput, samples per second as rank 0 reports it


@dataclass(frozen=True)
class SpendPoint:
    at: datetime
    usd: Decimal  # total spend of the job's leases up to `at`


@dataclass(frozen=True)
class Marker:
    """An event placed on the time axis."""

    at: datetime
    kind: str  # the ledger's event kind, e.g. "PREEMPTED"
    category: str  # see MARKED_EVENTS
    message: str
    step: int | None

    @property
    def label(self) -> str:
        return self.kind if self.step is None else f"{self.kind} @{self.step}"


@dataclass(frozen=True)
class ReportData:
    """Everything a report draws for one job. The time axis runs from `start` to `end`."""

    job_id: str
    name: str
    state: str
    provider: str
    nodes: int
    gpus_per_node: int
    start: datetime
    end: datetime
    utilization: tuple[UtilSeries, ...]
    spend: tuple[SpendPoint, ...]
    budget_usd: Decimal | None
    markers: tuple[Marker, ...]
    progress: tuple[ProgressPoint, ...] = ()
    reason: tuple[str, ...] = ()  # the first lines of why the job ended, unless it succeeded
    memory: tuple[MemorySeries, ...] = ()

    @property
    def live(self) -> bool:
        """Whether the job has not ended (its charts may still fill in)."""
        return not JobState(self.state).is_final

    @property
    def total_spend(self) -> Decimal:
        return self.spend[-1].usd if self.spend else Decimal(0)

    @property
    def utilization_kind(self) -> str:
        """ "gpu", "cpu" (no node had GPUs), "mixed", or "none" (no readings recorded)."""
        kinds = {series.is_cpu for series in self.utilization}
        if not kinds:
            return "none"
        if kinds == {True}:
            return "cpu"
        return "gpu" if kinds == {False} else "mixed"

    @property
    def sample_count(self) -> int:
        return sum(len(series.times) for series in self.utilization)

    def seconds(self, at: datetime) -> float:
        """Seconds from the start of the time axis to `at`."""
        return (at - self.start).total_seconds()


def lease_spend_at(lease: Lease, at: datetime) -> Decimal:
    """What `lease` had cost by `at`: its price from launch until `at` or its end if earlier."""
    end = at if lease.ended_at is None else min(at, lease.ended_at)
    seconds = Decimal(str((end - lease.launched_at).total_seconds()))
    return max(Decimal(0), seconds) * lease.price_per_hour / Decimal(3600)


def spend_curve(leases: Sequence[Lease], start: datetime, end: datetime) -> list[SpendPoint]:
    """The job's spend from `start` to `end`, one point per corner of the curve.

    Between two consecutive points the set of running leases does not change, so the spend
    grows linearly there: joining the points with straight lines draws the exact curve. An
    open lease bills up to `end`. No leases gives a flat zero line.
    """
    corners = {start, end}
    for lease in leases:
        for moment in (lease.launched_at, lease.ended_at):
            if moment is not None and start < moment < end:
                corners.add(moment)
    return [
        SpendPoint(at, sum((lease_spend_at(lease, at) for lease in leases), Decimal(0)))
        for at in sorted(corners)
    ]


def _by_gpu(
    samples: Iterable[GpuSampleRecord],
) -> list[tuple[tuple[int, int], list[GpuSampleRecord]]]:
    """The samples of each (node, GPU), ordered by node then GPU, each list by time."""
    grouped: dict[tuple[int, int], list[GpuSampleRecord]] = {}
    for sample in samples:
        grouped.setdefault((sample.rank, sample.gpu), []).append(sample)
    for rows in grouped.values():
        rows.sort(key=lambda row: row.at)
    return sorted(grouped.items())


def utilization_series(samples: Iterable[GpuSampleRecord]) -> list[UtilSeries]:
    """One series per (node, GPU), ordered by node then GPU (CPU first), points by time."""
    return [
        UtilSeries(
            node=node,
            gpu=gpu,
            times=tuple(row.at for row in rows),
            values=tuple(
                row.util_pct if row.ok and row.util_pct is not None else None for row in rows
            ),
        )
        for (node, gpu), rows in _by_gpu(samples)
    ]


def memory_series(samples: Iterable[GpuSampleRecord]) -> list[MemorySeries]:
    """One series per (node, GPU) with GPU memory, ordered by node then GPU, points by time.

    The rules of `utilization_series` and `without_phantom_gpus`: the CPU fallback's rows
    (GPU index CPU_GPU_INDEX) carry no memory and make no series, and on a node read by its
    CPU a GPU whose utilization was never known is left out. A reading without a number is
    None (a GPU whose utilization is unknown may still report its memory)."""
    rows = list(samples)
    kept = {(s.node, s.gpu) for s in without_phantom_gpus(utilization_series(rows))}
    return [
        MemorySeries(
            node=node,
            gpu=gpu,
            times=tuple(row.at for row in found),
            used_mib=tuple(row.mem_used_mib for row in found),
            total_mib=tuple(row.mem_total_mib for row in found),
        )
        for (node, gpu), found in _by_gpu(rows)
        if gpu != CPU_GPU_INDEX and (node, gpu) in kept
    ]


def without_phantom_gpus(series: Sequence[UtilSeries]) -> list[UtilSeries]:
    """`series` less the GPU series that never had a known reading on nodes read by their
    CPU: such a node has no GPU, and those rows only say nvidia-smi had not answered yet."""
    cpu_nodes = {s.node for s in series if s.is_cpu}
    return [
        s
        for s in series
        if s.is_cpu or s.node not in cpu_nodes or any(v is not None for v in s.values)
    ]


def progress_points(records: Iterable[ProgressSampleRecord]) -> list[ProgressPoint]:
    """The progress history by time."""
    return [
        ProgressPoint(r.at, r.step, r.loss, r.img_s) for r in sorted(records, key=lambda r: r.at)
    ]


def reason_lines(
    state: str, reason: str | None, *, lines: int = 2, width: int = 140
) -> tuple[str, ...]:
    """The first `lines` non-blank lines of why a job ended (each cut to `width` characters),
    for a job that ended other than by succeeding; nothing otherwise."""
    if not reason or state == JobState.SUCCEEDED.value or not JobState(state).is_final:
        return ()
    kept = [line.strip() for line in reason.splitlines() if line.strip()][:lines]
    return tuple(line if len(line) <= width else line[: width - 3] + "..." for line in kept)


def budget_from_spec(spec_json: str) -> Decimal | None:
    """`budget.max_cost_usd` of a spec recorded as JSON; None when unset or unreadable."""
    try:
        value = json.loads(spec_json).get("budget", {}).get("max_cost_usd")
        return None if value is None else Decimal(str(value))
    except (ValueError, AttributeError, InvalidOperation):
        return None


def event_markers(events: Iterable[Event]) -> list[Marker]:
    """The events of MARKED_EVENTS, in time order; every other kind is left off the axis."""
    return [
        Marker(event.at, event.kind, MARKED_EVENTS[event.kind], event.message, event.step)
        for event in sorted(events, key=lambda e: e.at)
        if event.kind in MARKED_EVENTS
    ]


def time_range(
    job: Job,
    leases: Sequence[Lease],
    events: Sequence[Event],
    samples: Sequence[GpuSampleRecord],
    now: datetime,
    progress: Sequence[ProgressSampleRecord] = (),
) -> tuple[datetime, datetime]:
    """From the job's submission to its end (or `now` while it, or one of its leases, runs),
    widened to take in every recorded moment."""
    running = not JobState(job.state).is_final or any(lease.ended_at is None for lease in leases)
    end = now if running or job.ended_at is None else job.ended_at
    moments = [job.created_at, end]
    moments += [lease.launched_at for lease in leases]
    moments += [lease.ended_at for lease in leases if lease.ended_at is not None]
    moments += [event.at for event in events] + [sample.at for sample in samples]
    moments += [record.at for record in progress]
    return min(moments), max(moments)


def build_report(
    job: Job,
    leases: Sequence[Lease],
    events: Sequence[Event],
    samples: Sequence[GpuSampleRecord],
    now: datetime,
    progress: Sequence[ProgressSampleRecord] = (),
) -> ReportData:
    """The report of `job` from its ledger rows, as of `now` (open leases bill until then)."""
    start, end = time_range(job, leases, events, samples, now, progress)
    return ReportData(
        job_id=job.id,
        name=job.name,
        state=job.state,
        provider=job.provider,
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        start=start,
        end=end,
        utilization=tuple(without_phantom_gpus(utilization_series(samples))),
        spend=tuple(spend_curve(leases, start, end)),
        budget_usd=budget_from_spec(job.spec_json),
        markers=tuple(event_markers(events)),
        progress=tuple(progress_points(progress)),
        reason=reason_lines(job.state, job.reason),
        memory=tuple(memory_series(samples)),
    )


def time_unit(span_seconds: float) -> tuple[str, float]:
    """The unit a time axis of this span reads best in: ("s", 1), ("min", 60) or ("h", 3600)."""
    if span_seconds <= 600:
        return "s", 1.0
    if span_seconds <= 3 * 3600:
        return "min", 60.0
    return "h", 3600.0
