"""The report's series from hand-built ledger rows in a real SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import Session

from orchestrator.ledger.store import (
    Event,
    GpuSampleRecord,
    Job,
    Lease,
    Ledger,
    ProgressSampleRecord,
    make_engine,
    total_cost,
)
from orchestrator.report.data import (
    budget_from_spec,
    event_markers,
    lease_spend_at,
    reason_lines,
    spend_curve,
    time_unit,
)
from orchestrator.report.write import report_data
from orchestrator.spec.model import JobSpec
from tests.support.fuzzing import examples

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spec_json(max_cost: str | None) -> str:
    budget = {} if max_cost is None else {"max_cost_usd": max_cost}
    raw = {"name": "rep", "workdir": ".", "run": "true", "budget": budget}
    return JobSpec.model_validate(raw).model_dump_json()


def make_job(
    state: str = "RUNNING", ended: datetime | None = None, max_cost: str | None = "0.5"
) -> Job:
    return Job(
        id="rep-1", name="rep", state=state, provider="local", nodes=2, gpus_per_node=2,
        spec_json=spec_json(max_cost), spec_path="job.yaml", created_at=T0, ended_at=ended,
    )  # fmt: skip


def lease(instance: str, price: str, start: float, end: float | None, rank: int = 0) -> Lease:
    return Lease(
        job_id="rep-1", cluster="rep-1", provider="local", instance_id=instance, rank=rank,
        market="spot", instance_type="local", price_per_hour=Decimal(price),
        launched_at=at(start), ended_at=None if end is None else at(end),
    )  # fmt: skip


def event(kind: str, seconds: float, message: str = "", step: int | None = None) -> Event:
    return Event(job_id="rep-1", at=at(seconds), kind=kind, message=message, step=step)


def sample(
    rank: int, gpu: int, seconds: float, util: float | None, ok: bool = True
) -> GpuSampleRecord:
    return GpuSampleRecord(
        job_id="rep-1", rank=rank, gpu=gpu, at=at(seconds), util_pct=util, ok=ok,
        mem_used_mib=None if gpu < 0 else 1000.0, mem_total_mib=None if gpu < 0 else 81559.0,
    )  # fmt: skip


def progress(
    seconds: float, step: int, loss: float | None = None, img_s: float | None = None
) -> ProgressSampleRecord:
    return ProgressSampleRecord(job_id="rep-1", at=at(seconds), step=step, loss=loss, img_s=img_s)


def ledger_with(tmp_path: Path, job: Job, rows: list[object]) -> Ledger:
    engine = make_engine(tmp_path / "orch.db")
    with Session(engine) as session:
        session.add(job)
        session.commit()
        session.add_all(rows)
        session.commit()
    return Ledger(engine)


# A: 3.6 $/h for 100 s; B: 7.2 $/h for 100 s, overlapping A; C: 1.8 $/h, still open at 200 s.
OVERLAPPING = [
    lease("a", "3.6", 10, 110, rank=0),
    lease("b", "7.2", 60, 160, rank=1),
    lease("c", "1.8", 100, None, rank=0),
]


def test_spend_curve_has_a_corner_at_every_launch_and_end_and_bills_the_open_lease(
    tmp_path: Path,
) -> None:
    ledger = ledger_with(tmp_path, make_job(), [*OVERLAPPING, event("RUNNING", 20)])
    data = report_data(ledger, "rep-1", now=at(200))
    assert data.start == T0 and data.end == at(200)  # running: the axis ends now
    curve = [(data.seconds(p.at), p.usd) for p in data.spend]
    assert curve == [
        (0, Decimal(0)),
        (10, Decimal(0)),
        (60, Decimal("0.05")),  # A alone for 50 s
        (100, Decimal("0.17")),  # A 90 s + B 40 s
        (110, Decimal("0.205")),  # A ends: 0.10 + B 0.10 + C 10 s 0.005
        (160, Decimal("0.33")),  # B ends: 0.10 + 0.20 + C 0.03
        (200, Decimal("0.35")),  # the open lease billed until now
    ]
    assert data.total_spend == ledger.spend("rep-1", at(200))  # the ledger's own figure
    assert data.budget_usd == Decimal("0.5")


def test_a_finished_job_ends_its_axis_at_its_end_and_its_spend_stays_flat(
    tmp_path: Path,
) -> None:
    rows = [lease("a", "3.6", 10, 110), lease("b", "7.2", 60, 160, rank=1)]
    job = make_job(state="SUCCEEDED", ended=at(170), max_cost=None)
    data = report_data(ledger_with(tmp_path, job, rows), "rep-1", now=at(5000))
    assert data.end == at(170)
    assert [data.seconds(p.at) for p in data.spend] == [0, 10, 60, 110, 160, 170]
    assert data.spend[-1].usd == data.spend[-2].usd == Decimal("0.3")
    assert data.budget_usd is None


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 500),
            st.one_of(st.none(), st.integers(0, 500)),
            st.decimals(min_value=Decimal("0.01"), max_value=Decimal("40"), places=2),
        ),
        max_size=6,
    ),
    st.integers(0, 1000),
)
def test_spend_curve_is_exact_linear_between_corners_and_never_jumps(
    raw: list[tuple[int, int | None, Decimal]], probe: int
) -> None:
    leases = [
        lease(f"n{i}", str(price), start, None if length is None else start + length)
        for i, (start, length, price) in enumerate(raw)
    ]
    start, end = T0, at(1000)
    curve = spend_curve(leases, start, end)
    assert curve[0].at == start and curve[-1].at == end
    assert curve[-1].usd == total_cost(leases, end)
    assert all(a.usd <= b.usd for a, b in zip(curve, curve[1:], strict=False))  # never drops
    # Anywhere between two corners the true spend is the straight line between them.
    moment = at(probe)
    left = max((p for p in curve if p.at <= moment), key=lambda p: p.at)
    right = min((p for p in curve if p.at >= moment), key=lambda p: p.at)
    truth = sum((lease_spend_at(x, moment) for x in leases), Decimal(0))
    if left.at == right.at:
        assert truth == left.usd
    else:
        share = Decimal((moment - left.at).total_seconds()) / Decimal(
            (right.at - left.at).total_seconds()
        )
        assert truth == pytest.approx(
            left.usd + share * (right.usd - left.usd), abs=Decimal("1e-20")
        )


def test_no_leases_is_a_flat_zero_line() -> None:
    assert [p.usd for p in spend_curve([], T0, at(30))] == [0, 0]


def test_utilization_has_one_series_per_node_and_gpu_with_gaps_for_unknown_readings(
    tmp_path: Path,
) -> None:
    rows = [
        sample(1, 0, 12, 40.0),
        sample(0, 1, 10, 55.0),
        sample(0, 0, 11, 90.0),  # written out of time order: series are sorted by time
        sample(0, 0, 10, 80.0),
        sample(0, 0, 12, None, ok=False),  # nvidia-smi said N/A
        sample(0, 1, 11, 7.0, ok=False),  # a reading that could not be trusted
    ]
    data = report_data(ledger_with(tmp_path, make_job(), rows), "rep-1", now=at(20))
    assert [(s.node, s.gpu, s.label) for s in data.utilization] == [
        (0, 0, "node 0 GPU 0"),
        (0, 1, "node 0 GPU 1"),
        (1, 0, "node 1 GPU 0"),
    ]
    first = data.utilization[0]
    assert [data.seconds(t) for t in first.times] == [10, 11, 12]
    assert first.values == (80.0, 90.0, None)
    assert [data.seconds(t) for t in first.unknown_times] == [12]
    assert data.utilization[1].values == (55.0, None)
    assert data.utilization_kind == "gpu" and data.sample_count == 6


def test_nodes_without_gpus_give_cpu_series(tmp_path: Path) -> None:
    rows = [sample(0, -1, 5, 150.0), sample(1, -1, 5, 2.0), sample(1, -1, 6, None, ok=False)]
    data = report_data(ledger_with(tmp_path, make_job(), rows), "rep-1", now=at(10))
    assert [s.label for s in data.utilization] == ["node 0 CPU", "node 1 CPU"]
    assert data.utilization_kind == "cpu"
    assert data.utilization[1].values == (2.0, None)
    mixed = report_data(
        ledger_with(tmp_path / "m", make_job(), [sample(0, -1, 5, 150.0), sample(1, 0, 5, 99.0)]),
        "rep-1",
        now=at(10),
    )
    assert mixed.utilization_kind == "mixed"


def test_markers_are_the_events_worth_a_line_in_time_order() -> None:
    events = [
        event("LAUNCHED", 1),
        event("SYNCED", 2),
        event("RUNNING", 3),
        event("CHECKPOINT", 9, "pulled step-000010", step=10),
        event("RESUMED", 30, step=10),
        event("PREEMPTED", 20, "spot notice"),
        event("SALVAGED", 20.5, "newest checkpoint step-000010", step=10),
        event("RECOVERING", 21),
        event("WARNING", 22, "during teardown"),
        event("ADOPTED", 25),
        event("IDLE_STOPPED", 40, "idle"),
        event("TERMINATED", 41),
    ]
    markers = event_markers(events)
    assert [(m.kind, m.category) for m in markers] == [
        ("RUNNING", "start"),
        ("CHECKPOINT", "checkpoint"),
        ("PREEMPTED", "interruption"),
        ("SALVAGED", "recovery"),
        ("RECOVERING", "recovery"),
        ("ADOPTED", "controller"),
        ("RESUMED", "recovery"),
        ("IDLE_STOPPED", "end"),
    ]
    assert markers[1].label == "CHECKPOINT @10" and markers[0].label == "RUNNING"
    for final in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "BUDGET_STOPPED"):
        assert event_markers([event(final, 1)])[0].category == "end"


def test_the_axis_takes_in_rows_recorded_after_the_jobs_end(tmp_path: Path) -> None:
    job = make_job(state="FAILED", ended=at(50))
    rows = [lease("a", "1", 5, 60), event("TERMINATED", 61)]
    data = report_data(ledger_with(tmp_path, job, rows), "rep-1", now=at(900))
    assert data.end == at(61)


def test_budget_is_read_from_the_recorded_spec() -> None:
    assert budget_from_spec(spec_json("20")) == Decimal("20")
    assert budget_from_spec(spec_json(None)) is None
    assert budget_from_spec("{}") is None
    assert budget_from_spec("not json") is None
    assert budget_from_spec('{"budget": {"max_cost_usd": "lots"}}') is None


def test_time_unit_fits_the_span() -> None:
    assert time_unit(45) == ("s", 1.0)
    assert time_unit(3600) == ("min", 60.0)
    assert time_unit(86400) == ("h", 3600.0)


def test_progress_history_is_read_in_time_order_and_widens_the_axis(tmp_path: Path) -> None:
    job = make_job(state="SUCCEEDED", ended=at(50))
    rows = [progress(20, 8, 2.1, 110.0), progress(10, 4, 2.3, 100.0), progress(60, 12)]
    data = report_data(ledger_with(tmp_path, job, rows), "rep-1", now=at(900))
    assert [(data.seconds(p.at), p.step, p.loss, p.img_s) for p in data.progress] == [
        (10, 4, 2.3, 100.0),
        (20, 8, 2.1, 110.0),
        (60, 12, None, None),
    ]
    assert data.end == at(60)
    assert report_data(ledger_with(tmp_path / "e", make_job(), []), "rep-1", at(5)).progress == ()


def test_a_node_read_by_its_cpu_has_no_phantom_gpu_series(tmp_path: Path) -> None:
    def cpu_node() -> list[object]:
        return [
            sample(0, 0, 4, None, ok=False),  # recorded before nvidia-smi said it was missing
            sample(0, -1, 5, 150.0),
            sample(0, -1, 6, 140.0),
        ]

    rows = [
        *cpu_node(),
        sample(1, 0, 5, 90.0),  # a real GPU on node 1
        sample(1, 1, 5, None, ok=False),  # an unknown GPU on a GPU node stays drawn
    ]
    data = report_data(ledger_with(tmp_path, make_job(), rows), "rep-1", now=at(10))
    assert [s.label for s in data.utilization] == ["node 0 CPU", "node 1 GPU 0", "node 1 GPU 1"]
    only = report_data(ledger_with(tmp_path / "c", make_job(), cpu_node()), "rep-1", now=at(10))
    assert [s.label for s in only.utilization] == ["node 0 CPU"]
    assert only.utilization_kind == "cpu"


def test_a_job_that_did_not_succeed_keeps_the_first_lines_of_its_reason(tmp_path: Path) -> None:
    job = make_job(state="FAILED", ended=at(30))
    job.reason = (
        "rank 0 (node 0): RuntimeError: boom\n\nTraceback (most recent call last):\n  File x\n"
    )
    data = report_data(ledger_with(tmp_path, job, []), "rep-1", now=at(60))
    assert data.reason == (
        "rank 0 (node 0): RuntimeError: boom",
        "Traceback (most recent call last):",
    )
    assert reason_lines("FAILED", "x" * 500, lines=1, width=20) == ("x" * 17 + "...",)
    assert reason_lines("SUCCEEDED", "finished") == ()
    assert reason_lines("RUNNING", "whatever") == ()
    assert reason_lines("BUDGET_STOPPED", "spend reached the cap") == ("spend reached the cap",)
    assert reason_lines("FAILED", None) == ()


def test_memory_has_one_series_per_gpu_under_the_utilization_rules(tmp_path: Path) -> None:
    unknown_memory = sample(1, 1, 6, 30.0)
    unknown_memory.mem_used_mib = unknown_memory.mem_total_mib = None
    rows = [
        sample(0, 0, 4, None, ok=False),  # node 0 has no GPU: nvidia-smi had not said so yet
        sample(0, -1, 5, 150.0),  # its CPU use: no memory, no series
        sample(1, 1, 5, None, ok=False),  # utilization unknown, memory known: kept
        unknown_memory,
        sample(1, 0, 5, 90.0),
    ]
    data = report_data(ledger_with(tmp_path, make_job(), rows), "rep-1", now=at(10))
    assert [(s.node, s.gpu, s.label) for s in data.memory] == [
        (1, 0, "node 1 GPU 0"),
        (1, 1, "node 1 GPU 1"),
    ]
    second = data.memory[1]
    assert [data.seconds(t) for t in second.times] == [5, 6]
    assert second.used_mib == (1000.0, None) and second.total_mib == (81559.0, None)
    assert second.known and data.memory[0].used_mib == (1000.0,)
    cpu_only = ledger_with(tmp_path / "c", make_job(), [sample(0, -1, 5, 150.0)])
    assert report_data(cpu_only, "rep-1", now=at(10)).memory == ()
