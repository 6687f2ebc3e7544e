"""What the ledger gets when checkpoints arrive (`CheckpointRecords.record`): a record per
version, a single file's with the step the run had reported when it was pulled; a CHECKPOINT
event per directory checkpoint, but a single file saved in place coalesced (its first version
at once, then at most one a minute), and the newest version held back written at the run's end
(`flush_events`). On a real SQLite ledger; the collections are built as the collector reports
them."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.checkpoints.collector import Collected
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.records import CheckpointRecords
from orchestrator.cluster.checkpoints.units import Unit, UnitFile
from orchestrator.config import Settings
from orchestrator.ledger.store import Job, Ledger, utcnow

JOB = "tutorial-9f8e"


def unit(name: str, kind: str, content: str) -> Unit:
    path = f"{name}/state.pt" if kind == "step" else name
    return Unit(name, kind, (UnitFile(path, 0, content * 8, 4096, "obj", None),), 0)


def arrived(records: CheckpointRecords, *units: Unit) -> None:
    records.record(Collected(installed=list(units), complete=list(units)), ranks=[0])


def test_a_snapshot_saved_in_place_is_coalesced_and_carries_the_step_reported(
    tmp_path: Path, ledger: Ledger
) -> None:
    ledger.add_job(
        Job(id=JOB, name="tutorial", provider="local", nodes=1, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=utcnow())
    )  # fmt: skip
    lines: list[str] = []
    records = CheckpointRecords(
        job_id=JOB, store=None, mirror=CheckpointMirror(tmp_path / "mirror"), ledger=ledger,
        settings=Settings(home=tmp_path / "orch"), line=lines.append,
    )  # fmt: skip
    for step in range(1, 31):  # a version a step, saved in place
        ledger.update_job(JOB, step=step)
        arrived(records, unit("snapshot.pt", "file", f"{step:02d}"))
    arrived(records, unit("step-000010", "step", "a"), unit("step-000020", "step", "b"))

    versions = [r for r in ledger.checkpoints(JOB) if r.name == "snapshot.pt"]
    assert [r.step for r in versions] == list(range(1, 31))  # every version, its step
    pulled = [(e.message, e.step) for e in ledger.events(JOB) if e.kind == "CHECKPOINT"]
    assert pulled == [
        ("pulled snapshot.pt (4096 bytes)", 1),  # the first at once; the rest held back
        ("pulled step-000010 (4096 bytes)", 10),  # every directory checkpoint
        ("pulled step-000020 (4096 bytes)", 20),
    ]

    records.flush_events()  # the run ends
    (last,) = [e for e in ledger.events(JOB) if e.kind == "CHECKPOINT"][3:]
    assert last.message.startswith("pulled snapshot.pt (4096 bytes; 29 versions since "), last
    assert last.step == 30
    assert len(lines) == 4 and lines[-1] == f"[orch] checkpoint {last.message}"
    records.flush_events()
    assert len([e for e in ledger.events(JOB) if e.kind == "CHECKPOINT"]) == 4
