"""What a job holds, said with the step and age of each checkpoint (`kept_summary`): the
SALVAGED event of a recovery names a single file (`snapshot.pt`) with the step the run had
reported when it was pulled, RESUMED names what was put back, and `orch cancel` says what the
job keeps. The runner on a real ledger with fake nodes (`tests.support.runner_fakes`); the
cancel through the real `orch cancel` entry point, in this process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.kept_summary import (
    Kept,
    age_text,
    describe_kept,
    kept_phrase,
    newest_kept,
)
from orchestrator.job_state import JobState
from orchestrator.ledger.store import CheckpointRecord, Ledger, make_engine, utcnow
from tests.support.in_process import isolated_home, run_main
from tests.support.ledger_rows import NOW, T0, add_job, at
from tests.support.runner_fakes import (
    JOB_ID,
    FakeAttempt,
    FakeKeeper,
    FakeProvider,
    loaded_job,
    lose_node_1_then_succeed,
    runner,
)
from tests.support.runner_fakes import (
    add_job as add_runner_job,
)


def record(
    name: str, kind: str, step: int | None, pulled: float, **fields: object
) -> CheckpointRecord:
    return CheckpointRecord(
        job_id=JOB_ID, name=name, kind=kind, step=step, size_bytes=4096, pulled_at=at(pulled),
        digest=f"{name}@{pulled}", **fields,
    )  # fmt: skip


def test_a_salvage_names_the_single_file_it_kept_with_its_step_and_age(
    tmp_path: Path, ledger: Ledger
) -> None:
    FakeAttempt.opened = []
    provider = FakeProvider(ledger.ledger_id)
    add_runner_job(ledger, loaded_job(tmp_path))
    saved = utcnow() - timedelta(seconds=12)
    ledger.add_checkpoint(
        CheckpointRecord(job_id=JOB_ID, name="snapshot.pt", kind="file", step=250,
                         size_bytes=4096, pulled_at=saved, digest="v1")
    )  # fmt: skip
    the_runner = runner(
        tmp_path, ledger, provider, lose_node_1_then_succeed(provider), keeper=FakeKeeper(ledger)
    )
    assert the_runner.run().state is JobState.SUCCEEDED

    (salvaged,) = [e for e in ledger.events(JOB_ID) if e.kind == "SALVAGED"]
    assert salvaged.message.startswith("newest checkpoint snapshot.pt (pulled at step 250, 1")
    assert " s old), " in salvaged.message and "after detection" in salvaged.message
    assert salvaged.step == 250
    (resumed,) = [e for e in ledger.events(JOB_ID) if e.kind == "RESUMED"]
    assert "put back: snapshot.pt (pulled at step 250, " in resumed.message, resumed.message
    assert resumed.step is None  # a file's step is not a step that was resumed


def test_the_newest_directory_and_each_files_newest_version_are_named() -> None:
    records = [
        record("step-000100", "step", 100, 10),
        record("step-000120", "step", 120, 20),
        record("snapshot.pt", "file", 90, 5),
        record("snapshot.pt", "file", 118, 19),
        record("last.ckpt", "file", None, 21),
    ]
    kept = newest_kept(records)
    assert [k.name for k in kept] == ["step-000120", "last.ckpt", "snapshot.pt"]
    assert describe_kept(kept, at(24)) == (
        "step-000120 (step 120, 4 s old), last.ckpt (3 s old) and "
        "snapshot.pt (pulled at step 118, 5 s old)"
    )
    held_back = {("step-000120", "step-000120@20")}  # a version a restart could not load
    assert newest_kept(records, held_back)[0].name == "step-000100"


def test_how_a_summary_says_it() -> None:
    one = [Kept("snapshot.pt", 250, T0, "file")]
    assert kept_phrase([], NOW) == "no checkpoint kept"
    assert kept_phrase(one, T0 + timedelta(minutes=3)) == (
        "newest checkpoint snapshot.pt (pulled at step 250, 3 min old)"
    )
    many = [Kept(f"f{i}.pt", None, T0, "file") for i in range(5)]
    assert describe_kept(many, T0).endswith("f2.pt (0 s old) and 2 more file(s)")
    assert [age_text(s) for s in (0, 89.4, 95, 7200, 3 * 86400)] == [
        "0 s", "89 s", "2 min", "2.0 h", "3.0 days"
    ]  # fmt: skip


def test_cancel_says_what_the_job_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = isolated_home(tmp_path, monkeypatch)
    ledger = Ledger(make_engine(home / "orch.db"))
    add_job(ledger, "tut-1", JobState.RUNNING, 0, started_at=at(10), step=260)
    ledger.add_checkpoint(
        CheckpointRecord(job_id="tut-1", name="snapshot.pt", kind="file", step=250,
                         size_bytes=4096, pulled_at=utcnow() - timedelta(minutes=4), digest="v")
    )  # fmt: skip
    code, out, err = run_main(["cancel", "tut-1"])
    assert code == 0, out + err
    assert "job tut-1: CANCELLED" in out, out
    assert "newest checkpoint snapshot.pt (pulled at step 250, 4 min old)" in out, out
