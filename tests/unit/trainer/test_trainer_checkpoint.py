"""Checkpoint layout on disk, finding the one to resume, pruning."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from orch_trainer.checkpoint import (
    find_latest,
    is_complete,
    list_complete,
    load_state,
    prune,
    resolve_resume,
    save_checkpoint,
)
from orch_trainer.errors import CheckpointError


def _state(step: int) -> dict[str, object]:
    return {"format": 1, "step": step, "weights": torch.full((3,), float(step))}


def _fake_checkpoint(directory: Path, name: str, *, marker: bool = True) -> Path:
    path = directory / name
    path.mkdir(parents=True)
    torch.save(_state(0), path / "state.pt")
    if marker:
        (path / "COMPLETE").touch()
    return path


def test_save_writes_the_documented_layout(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 120, _state(120), keep=3)
    assert path == tmp_path / "step-000120"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "state.pt"]
    assert (path / "COMPLETE").stat().st_size == 0
    assert (tmp_path / "latest").read_text() == "step-000120\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000120"]
    assert torch.equal(load_state(path)["weights"], torch.full((3,), 120.0))


def test_save_keeps_the_newest_k_and_points_latest_at_the_last(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(tmp_path, step, _state(step), keep=2)
    assert [p.name for p in list_complete(tmp_path)] == ["step-000004", "step-000005"]
    assert (tmp_path / "latest").read_text() == "step-000005\n"


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 7, _state(1), keep=3)
    save_checkpoint(tmp_path, 7, _state(2), keep=3)
    assert load_state(tmp_path / "step-000007")["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000007"]


def test_incomplete_and_temporary_dirs_are_never_chosen(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, "step-000010")
    _fake_checkpoint(tmp_path, "step-000030", marker=False)
    _fake_checkpoint(tmp_path, ".tmp-step-000040-123")
    _fake_checkpoint(tmp_path, "step-40")  # not the step-%06d form
    (tmp_path / "step-000050").mkdir()
    (tmp_path / "step-000050" / "COMPLETE").touch()  # marker but no state
    assert find_latest(tmp_path) == tmp_path / "step-000010"
    assert not is_complete(tmp_path / "step-000030")
    assert not is_complete(tmp_path / ".tmp-step-000040-123")


def test_latest_is_by_step_number_not_by_name(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, "step-999999")
    _fake_checkpoint(tmp_path, "step-1000000")
    assert find_latest(tmp_path) == tmp_path / "step-1000000"
    assert find_latest(tmp_path / "missing") is None


def test_prune_removes_stale_temp_dirs_of_other_processes_only(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, "step-000001")
    stale = _fake_checkpoint(tmp_path, ".tmp-step-000002-1")
    mine = _fake_checkpoint(tmp_path, f".tmp-step-000003-{os.getpid()}")
    foreign = _fake_checkpoint(tmp_path, ".tmp-something-else")
    removed = prune(tmp_path, keep=5)
    assert removed == [stale]
    assert mine.exists() and foreign.exists()


def test_resolve_resume_none_and_auto(tmp_path: Path) -> None:
    assert resolve_resume("none", tmp_path, {"ORCH_RESUME_FROM": "/x"}) is None
    assert resolve_resume("auto", tmp_path, {}) is None
    assert resolve_resume("auto", None, {}) is None
    first = _fake_checkpoint(tmp_path, "step-000002")
    newest = _fake_checkpoint(tmp_path, "step-000004")
    assert resolve_resume("auto", tmp_path, {"ORCH_RESUME_FROM": ""}) == newest
    # the orchestrator's choice wins over the newest one in the dir
    assert resolve_resume("auto", tmp_path, {"ORCH_RESUME_FROM": str(first)}) == first
    assert resolve_resume("auto", None, {"ORCH_RESUME_FROM": str(first / "state.pt")}) == first


def test_resolve_resume_by_path(tmp_path: Path) -> None:
    good = _fake_checkpoint(tmp_path, "step-000003")
    assert resolve_resume(str(good), None, {}) == good
    assert resolve_resume(str(good / "state.pt"), None, {}) == good
    half = _fake_checkpoint(tmp_path, "step-000005", marker=False)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume(str(half), None, {})
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume("auto", tmp_path, {"ORCH_RESUME_FROM": str(half)})
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(str(tmp_path / "step-000009"), None, {})
    temp = tmp_path / ".tmp-step-000006-1"
    shutil.copytree(good, temp)
    with pytest.raises(CheckpointError):
        resolve_resume(str(temp), None, {})


def test_load_state_reports_a_corrupt_file(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path, "step-000001")
    (path / "state.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_state(path)
