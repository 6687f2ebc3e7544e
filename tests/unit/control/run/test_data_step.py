"""The data step's pure parts: what its events say, where a cache manifest lies, and the
limits a phase is held to while data moves (progress shown, a stalled phase failed, the
budget read)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cluster.bucket_transfers import Tick
from orchestrator.control.run import data_step
from orchestrator.control.run.data_step import (
    DataStep,
    PhaseStopped,
    _Watch,
    fetch_summary,
    manifest_path,
    output_label,
    upload_summary,
)
from orchestrator.control.run.options import RunnerOptions
from orchestrator.errors import DataError
from orchestrator.job_state import JobState
from orchestrator.node.bucket_lines import BucketLines
from orchestrator.report.documents import outputs_document


def run(**done: object) -> BucketLines:
    return BucketLines(done=dict(done))  # type: ignore[arg-type]


def test_a_fetch_summary_adds_up_every_node() -> None:
    runs = [run(objects=41, fetched=2, bytes=120_000, kept=39, removed=1, seconds=0.5)] * 3
    assert fetch_summary(runs) == (
        "41 object(s) on 3 node(s): downloaded 6 (351.6 KiB), kept 117 from the nodes' cache, "
        "removed 3 gone from the bucket, 0.5 s"
    )
    nothing = [run(objects=41, fetched=0, bytes=0, kept=41, seconds=0.1)] * 3
    assert "downloaded 0 (0 B), kept 123" in fetch_summary(nothing)


def test_an_upload_summary_says_what_went_and_what_was_skipped() -> None:
    assert upload_summary(run(files=3, bytes=3 * 2**20, skipped=1, seconds=2.0)) == (
        "uploaded 3 file(s), 3.0 MiB in 2.0 s, 1 symlink(s) skipped"
    )
    assert upload_summary(run(files=0, missing=True)).startswith("nothing to upload")


def test_the_manifest_lies_beside_the_destination() -> None:
    assert manifest_path("ds") == ".ds.orch-data.json"
    assert manifest_path("data/ds/") == "data/.ds.orch-data.json"
    assert manifest_path("/mnt/x/model.bin") == "/mnt/x/.model.bin.orch-data.json"


def test_status_lists_each_output_with_its_own_uploads() -> None:
    spec = {"outputs": [{"src": "~/out", "dst": "s3://b/r", "nodes": "all"},
                        {"src": "~/logs", "dst": "s3://b/l"}]}  # fmt: skip
    events = [
        {"at": "2026-12-07T10:00:00Z", "kind": "OUTPUTS",
         "message": output_label(0, 1, "~/out", "s3://b/r/node-1") + ": uploaded 1 file(s)"},
        {"at": "2026-12-07T10:00:01Z", "kind": "OUTPUTS", "message": "failed (job failed): x"},
        {"at": "2026-12-07T10:00:02Z", "kind": "DATA", "message": "outputs[1] not an upload"},
    ]  # fmt: skip
    found = outputs_document(spec, events)
    assert [len(o["uploads"]) for o in found] == [2, 1]
    assert found[1] == {"src": "~/logs", "dst": "s3://b/l", "nodes": "head",
                        "uploads": [{"at": "2026-12-07T10:00:01Z",
                                     "message": "failed (job failed): x"}]}  # fmt: skip
    assert outputs_document({"outputs": "not a list"}, events) == []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watched(monkeypatch: pytest.MonkeyPatch, start_timeout: float | None):  # noqa: ANN201
    clock = Clock()
    monkeypatch.setattr(data_step.time, "monotonic", clock)
    said: list[tuple[str, str]] = []
    budget_reads: list[float] = []
    step = SimpleNamespace(
        reporter=SimpleNamespace(phase=lambda text: said.append(("phase", text))),
        journal=SimpleNamespace(event=lambda kind, text: said.append((kind, text))),
        loaded=SimpleNamespace(spec=SimpleNamespace(
            recovery=SimpleNamespace(start_timeout=start_timeout))),
        check_budget=lambda: budget_reads.append(clock.now),
    )  # fmt: skip
    return _Watch(step), clock, said, budget_reads  # type: ignore[arg-type]


def test_progress_goes_to_the_view_each_tick_and_to_an_event_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch, clock, said, budget_reads = watched(monkeypatch, 60.0)
    for second in range(61):
        clock.now = 1000.0 + second
        watch(Tick("bucket data", second * 2**20, 100 * 2**20, float(second)))
    phases = [text for kind, text in said if kind == "phase"]
    assert len(phases) == 61
    assert phases[30] == "bucket data: 30.0 MiB of 100.0 MiB, 1.0 MiB/s, 70 s left"
    assert [text for kind, text in said if kind == "DATA"] == [phases[30], phases[60]]
    assert budget_reads == [1000.0 + s for s in range(0, 61, 10)]


def test_a_phase_that_moves_nothing_for_the_start_timeout_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch, clock, _said, _reads = watched(monkeypatch, 60.0)
    watch(Tick("bucket data", 5, 100, 1.0))
    clock.now += 60
    watch(Tick("bucket data", 5, 100, 61.0))
    clock.now += 1
    with pytest.raises(DataError, match=r"no byte moved for 61 s \(recovery.start_timeout 60 s\)"):
        watch(Tick("bucket data", 5, 100, 62.0))


def test_without_a_start_timeout_a_slow_phase_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    watch, clock, _said, _reads = watched(monkeypatch, None)
    watch(Tick("bucket data", 5, 100, 1.0))
    clock.now += 10_000
    watch(Tick("bucket data", 5, 100, 10_001.0))


def test_the_node_to_node_stage_is_not_judged_quiet_between_its_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch, clock, _said, _reads = watched(monkeypatch, 60.0)
    watch(Tick(data_step.NODE_TO_NODE, 0, 100, 1.0))
    clock.now += 600
    watch(Tick(data_step.NODE_TO_NODE, 0, 100, 601.0))


def budget_step(max_cost: str | None, spent_hours: float, price: str) -> DataStep:
    from datetime import timedelta
    from decimal import Decimal

    from orchestrator.ledger.store import utcnow

    lease = SimpleNamespace(
        launched_at=utcnow() - timedelta(hours=spent_hours), ended_at=None,
        price_per_hour=Decimal(price),
    )  # fmt: skip
    journal = SimpleNamespace(
        job=SimpleNamespace(id="j"), ledger=SimpleNamespace(leases=lambda job_id: [lease])
    )
    budget = SimpleNamespace(
        max_cost_usd=None if max_cost is None else Decimal(max_cost), max_hourly_usd=None
    )
    loaded = SimpleNamespace(spec=SimpleNamespace(budget=budget))
    return DataStep(
        journal=journal, reporter=SimpleNamespace(), loaded=loaded,  # type: ignore[arg-type]
        settings=None, options=RunnerOptions(),  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_budget_reached_while_data_moves_stops_the_job_as_a_budget_stop() -> None:
    budget_step("10", spent_hours=1.0, price="2.0").check_budget()  # $2 of $10: goes on
    budget_step(None, spent_hours=100.0, price="2.0").check_budget()  # no cap
    with pytest.raises(PhaseStopped) as stopped:
        budget_step("10", spent_hours=5.0, price="2.0").check_budget()
    assert stopped.value.order.state is JobState.BUDGET_STOPPED
    assert stopped.value.exit_code == 4


def test_a_local_source_gone_since_the_submit_is_named_before_anything_moves(
    tmp_path: Path,
) -> None:
    from orchestrator.spec.model import DataMount

    step = budget_step(None, spent_hours=0.0, price="0")
    step.loaded.spec.data = [DataMount(src="./shards", dst="~/shards")]  # type: ignore[attr-defined]
    step.loaded.data_sources = [tmp_path / "shards"]  # type: ignore[attr-defined]
    attempt = SimpleNamespace(cluster=SimpleNamespace(instances=[object()]))
    with pytest.raises(DataError) as failed:
        step.bring(attempt)  # type: ignore[arg-type]
    assert failed.value.message == (
        f"data[0].src ./shards ({tmp_path / 'shards'}) no longer exists on this machine"
    )
    assert "nothing of the job is left running" in (failed.value.hint or "")


def test_an_output_of_a_node_that_is_gone_is_said_not_uploaded() -> None:
    from orchestrator.spec.model import OutputMount

    step = budget_step(None, spent_hours=0.0, price="0")
    written: list[tuple[str, str]] = []
    step.journal.event = lambda kind, text: written.append((kind, text))  # type: ignore[attr-defined]
    step.loaded.spec.outputs = [OutputMount(src="~/out", dst="s3://results/run")]  # type: ignore[attr-defined]
    attempt = SimpleNamespace(
        connected=True, gone_ranks={0}, cluster=SimpleNamespace(instances=[object(), object()])
    )
    step.upload_outputs(attempt, ranks=None, why="job failed")  # type: ignore[arg-type]
    assert written == [
        ("OUTPUTS", "outputs[0] node 0: ~/out -> s3://results/run: not uploaded, the node is "
                    "gone (job failed)")
    ]  # fmt: skip
