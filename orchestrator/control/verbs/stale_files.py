"""Files of the local workdir that a run may take for a checkpoint: those a sync would send
into `checkpoint.dir` (a folder of the workdir, or the workdir itself with `dir: .`) that look
like one. A `snapshot.pt` left there by a trial run on this machine reaches every node, and a
script that loads what it finds there resumes from it; `orch submit` warns about them, and
`orch submit --fresh` leaves them out of the sync (`LoadedJob.left_out`).

What looks like a checkpoint: in a folder of its own (`dir: ckpt`), every file the checkpoint
agent would look at (not a temporary, `__pycache__`, `*.pyc`, `*.egg-info`, `.git`, nor a
`.gitignore` or `.orchignore`); in the
workdir itself (`dir: .`), a file saved in a checkpoint format (`.pt`, `.pth`, `.ckpt`,
`.safetensors`, DCP's `.distcp` and `.metadata`) or one in a folder named for checkpoints or
a step (`checkpoints/`, `ckpt/`, `snapshots/`, `step-000100/`, `checkpoint-500/`). What the
sync leaves out (`.gitignore`, `.orchignore`) is never named: rsync itself says what it sends.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cluster.checkpoints.kept_summary import age_text
from orchestrator.node.checkpoint_files import DCP_METADATA, skipped
from orchestrator.remote.listing import synced_files
from orchestrator.spec.model import LoadedJob

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".distcp")
_CHECKPOINT_FOLDER = re.compile(
    r"^(checkpoints?|ckpts?|snapshots?)$|^(checkpoint|ckpt|step|global_step|epoch)[-_=]?\d+$",
    re.IGNORECASE,
)
SHOWN = 10  # files named one by one; the rest are counted
SYNC_FILTERS = (".gitignore", ".orchignore")  # the sync's own rules, never a checkpoint


def local_checkpoint_dir(spec_dir: str | None) -> str | None:
    """Where `checkpoint.dir` lies in the workdir as a sync sends it: "" for the workdir itself
    (`.`, `./`), `ckpt/x` for a folder in it; None when no synced file lands there (unset: the
    job's own folder on the node; `~`, `~/x`, an absolute path, or one that leads out)."""
    if spec_dir is None or spec_dir.startswith(("~", "/")):
        return None
    normal = posixpath.normpath(spec_dir)
    if normal == ".":
        return ""
    if normal == ".." or normal.startswith("../"):
        return None
    return normal


def looks_like_checkpoint(rel: str, *, own_folder: bool) -> bool:
    """Whether a file at `rel` (relative to the checkpoint directory) may be taken for a
    checkpoint: see the module docstring. `own_folder`: the directory is a folder of the
    workdir, not the workdir itself."""
    if skipped(rel) or rel.rsplit("/", 1)[-1] in SYNC_FILTERS:
        return False
    if own_folder:
        return True
    parts = rel.split("/")
    return (
        parts[-1].endswith(CHECKPOINT_SUFFIXES)
        or parts[-1] == DCP_METADATA
        or any(_CHECKPOINT_FOLDER.search(part) for part in parts[:-1])
    )


@dataclass(frozen=True)
class StaleFile:
    """A workdir file that may be taken for a checkpoint."""

    path: str  # relative to the workdir, '/'-separated
    size: int  # bytes
    modified_at: datetime  # its mtime, UTC

    def as_dict(self, now: datetime) -> dict[str, object]:
        return {
            "path": self.path,
            "size": self.size,
            "modified_at": self.modified_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "age_s": round(max(0.0, (now - self.modified_at).total_seconds())),
        }


def size_text(size: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class StaleCheckpoints:
    """What a submit found under `checkpoint.dir` in the workdir, and whether `--fresh` leaves
    it out of the sync."""

    checkpoint_dir: str  # as the spec gives it
    files: tuple[StaleFile, ...]
    fresh: bool  # left out of the sync (`orch submit --fresh`)

    def headline(self) -> str:
        count = len(self.files)
        what = (
            f"{count} file(s) in the workdir under checkpoint.dir {self.checkpoint_dir} that "
            "the run may take for a checkpoint"
        )
        if self.fresh:
            return f"left out of the sync (--fresh): {what}"
        return (
            f"warning: {what}: they are synced to every node, and a script that resumes from "
            "what it finds there resumes from them"
        )

    def lines(self, now: datetime) -> list[str]:
        """One line per file (name, size, age), the first `SHOWN` of them."""
        lines = [
            f"{f.path}  {size_text(f.size)}, modified "
            f"{age_text((now - f.modified_at).total_seconds())} ago"
            for f in self.files[:SHOWN]
        ]
        if len(self.files) > SHOWN:
            lines.append(f"... and {len(self.files) - SHOWN} more")
        return lines

    @property
    def hint(self) -> str | None:
        if self.fresh:
            return None
        return (
            "to start without them, submit with --fresh (it leaves them out of the sync); to "
            "never sync them, list them in .orchignore, or delete them"
        )

    def event(self, now: datetime) -> tuple[str, str]:
        """The job's event about them: a WARNING when they are synced, LEFT_OUT when not."""
        named = "; ".join(self.lines(now))
        if self.fresh:
            return "LEFT_OUT", f"{self.headline()}: {named}"
        return "WARNING", f"{self.headline()}: {named}; {self.hint}"

    def as_dict(self, now: datetime) -> dict[str, object]:
        return {
            "checkpoint_dir": self.checkpoint_dir,
            "left_out": self.fresh,
            "files": [f.as_dict(now) for f in self.files],
        }


def stale_files(workdir: Path, under: str, synced: Iterable[str]) -> tuple[StaleFile, ...]:
    """The files of `synced` (paths in `workdir`) below the checkpoint folder `under` ("": the
    workdir) that look like a checkpoint and are regular files here, by path."""
    prefix = f"{under}/" if under else ""
    found: list[StaleFile] = []
    for rel in sorted(set(synced)):
        if not rel.startswith(prefix):
            continue
        if not looks_like_checkpoint(rel[len(prefix) :], own_folder=bool(under)):
            continue
        try:
            info = os.lstat(workdir / rel)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            modified = datetime.fromtimestamp(info.st_mtime, UTC)
            found.append(StaleFile(rel, info.st_size, modified))
    return tuple(found)


def find_stale(loaded: LoadedJob, *, fresh: bool) -> StaleCheckpoints | None:
    """What the job's workdir holds under its `checkpoint.dir` that may be taken for a
    checkpoint; None when there is nothing (or rsync could not say)."""
    spec_dir = loaded.spec.checkpoint.dir
    under = local_checkpoint_dir(spec_dir)
    if spec_dir is None or under is None:
        return None
    synced = synced_files(loaded.workdir, under)
    files = stale_files(loaded.workdir, under, synced or [])
    return StaleCheckpoints(spec_dir, files, fresh) if files else None
