"""Checkpoints on disk: atomic writes, finding the newest complete one, pruning.

Layout of a checkpoint directory (the orchestrator relies on it exactly):

    <dir>/step-000120/state.pt    torch.save of the training state (see orch_trainer.state)
    <dir>/step-000120/COMPLETE    empty marker, written last
    <dir>/latest                  "step-000120\\n", the last checkpoint written

Writing one (`save_checkpoint`): everything goes to `<dir>/.tmp-step-000120-<pid>/` first;
state.pt and COMPLETE are fsynced, then the temp dir, then it is renamed to `step-000120`
and `<dir>` is fsynced; `latest` is then replaced the same way (temp file, fsync, rename).
Only then are older checkpoints pruned down to the newest `keep`.

Reading: a directory is a checkpoint only if its name is `step-<digits>` and it holds both
state.pt and COMPLETE. Anything else (no marker, `.tmp-*`) is never resumed from.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from orch_trainer.errors import CheckpointError

STATE_FILE = "state.pt"
MARKER_FILE = "COMPLETE"
LATEST_FILE = "latest"
TEMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^step-(\d{6,})$")
_OWN_TEMP = re.compile(r"^\.tmp-(?:replaced-)?step-\d{6,}-(\d+)$")


def checkpoint_name(step: int) -> str:
    """`step-%06d`."""
    return f"step-{step:06d}"


def step_of(path: Path) -> int | None:
    """The step in a checkpoint directory's name, or None when the name is not one."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    """True for a `step-*` directory holding state.pt and the COMPLETE marker."""
    return (
        step_of(path) is not None
        and path.is_dir()
        and (path / MARKER_FILE).is_file()
        and (path / STATE_FILE).is_file()
    )


def list_complete(directory: Path) -> list[Path]:
    """Complete checkpoints in `directory`, oldest step first ([] when it does not exist)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if is_complete(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def find_latest(directory: Path) -> Path | None:
    """The complete checkpoint with the highest step in `directory`, if any."""
    complete = list_complete(directory)
    return complete[-1] if complete else None


def _as_checkpoint_dir(path: Path) -> Path:
    """A checkpoint named by its directory or its state.pt -> its directory."""
    return path.parent if path.name == STATE_FILE else path


def resolve_resume(
    resume: str, checkpoint_dir: Path | None, environ: Mapping[str, str]
) -> Path | None:
    """Which checkpoint directory to resume from, or None for a fresh start.

    - "none": None.
    - "auto": `$ORCH_RESUME_FROM` when set and non-empty (it must be complete), else the newest
      complete checkpoint in `checkpoint_dir`, else None.
    - anything else: a path to a complete `step-*` directory or its state.pt.

    Raise `CheckpointError` when a named checkpoint is missing or incomplete.
    """
    if resume == "none":
        return None
    if resume == "auto":
        named = environ.get("ORCH_RESUME_FROM", "")
        if named:
            return _checked(Path(named).expanduser(), "ORCH_RESUME_FROM")
        return find_latest(checkpoint_dir) if checkpoint_dir is not None else None
    return _checked(Path(resume).expanduser(), "--resume")


def _checked(path: Path, source: str) -> Path:
    directory = _as_checkpoint_dir(path)
    if not directory.exists():
        raise CheckpointError(f"{source}: checkpoint {path} does not exist")
    if not is_complete(directory):
        raise CheckpointError(
            f"{source}: {directory} is not a complete checkpoint "
            f"(needs a step-NNNNNN folder holding {STATE_FILE} and {MARKER_FILE})"
        )
    return directory


def load_state(directory: Path) -> dict[str, Any]:
    """The state dict saved in a complete checkpoint directory (tensors on the CPU)."""
    try:
        state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt file can fail in many ways inside the unpickler
        raise CheckpointError(f"cannot read {directory / STATE_FILE}: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{directory / STATE_FILE} does not hold a trainer state")
    return state


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_latest(directory: Path, name: str) -> None:
    """Point `<directory>/latest` at checkpoint `name` (temp file, fsync, rename, fsync dir)."""
    temp = directory / f"{TEMP_PREFIX}{LATEST_FILE}-{os.getpid()}"
    _write_durable(temp, f"{name}\n".encode())
    os.replace(temp, directory / LATEST_FILE)
    _fsync_dir(directory)


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], *, keep: int) -> Path:
    """Write `state` as checkpoint `step` atomically, update `latest`, prune; return its path.

    An existing checkpoint of the same step is replaced (it is only briefly absent, and
    `latest` is rewritten after the new one is in place).
    """
    directory.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    final = directory / name
    temp = directory / f"{TEMP_PREFIX}{name}-{os.getpid()}"
    if temp.exists():
        shutil.rmtree(temp)
    temp.mkdir()
    with open(temp / STATE_FILE, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    _write_durable(temp / MARKER_FILE, b"")
    _fsync_dir(temp)
    if final.exists():
        replaced = directory / f"{TEMP_PREFIX}replaced-{name}-{os.getpid()}"
        os.replace(final, replaced)
        os.replace(temp, final)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.replace(temp, final)
    _fsync_dir(directory)
    write_latest(directory, name)
    prune(directory, keep=keep, protect=final)
    return final


def prune(directory: Path, *, keep: int, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints, and stale temp dirs.

    Stale temp dirs are checkpoint temp dirs (`.tmp-step-NNNNNN-<pid>`) left by another
    process, e.g. one killed while saving; nothing else is touched. `protect` is never
    deleted. Return what was deleted.
    """
    removed: list[Path] = []
    complete = list_complete(directory)
    for old in complete[: max(len(complete) - keep, 0)]:
        if protect is not None and old == protect:
            continue
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    for entry in directory.iterdir():
        match = _OWN_TEMP.match(entry.name)
        if match and int(match.group(1)) != os.getpid() and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
