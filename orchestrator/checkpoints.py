"""Mirror rank 0's checkpoint directory into ORCH_HOME/jobs/<id>/checkpoints, safely.

Two kinds of checkpoint are understood (DESIGN.md, "Checkpoints"):

- orch's trainer contract: a directory `step-000123/` is complete once it holds `COMPLETE`;
  an incomplete one, or anything whose name starts with `.tmp`, is never pulled.
- any other file a script writes (`snapshot.pt` rewritten in place): taken only when it is
  stable, i.e. same size and mtime on two consecutive looks (or when the job has ended).

Each pulled file lands in a staging directory first and is then moved into the mirror with an
atomic rename, so the previous good copy stays readable until the new one is complete.
`plan_pull` is pure; `CheckpointMirror` does the I/O through the callables it is given.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

COMPLETE_MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class RemoteEntry:
    """One entry of a remote listing (`find -printf '%P\\t%y\\t%s\\t%T@\\0'`)."""

    path: str  # relative to the checkpoint directory, '/'-separated
    kind: str  # 'f' file, 'd' directory, 'l' symlink, ...
    size: int
    mtime: float


def listing_command(checkpoint_dir_expr: str) -> str:
    """Shell command listing a checkpoint dir (a quoted shell expression); empty if missing.

    Records end with NUL, the one byte a file name cannot hold, so names with newlines or
    tabs cannot forge entries.
    """
    return (
        f'd={checkpoint_dir_expr}; [ -d "$d" ] || exit 0; '
        "find \"$d\" -mindepth 1 -printf '%P\\t%y\\t%s\\t%T@\\0'"
    )


def parse_listing(text: str) -> dict[str, RemoteEntry]:
    """Parse `listing_command` output; malformed records are skipped."""
    entries: dict[str, RemoteEntry] = {}
    for record in text.split("\0"):
        parts = record.rsplit("\t", 3)  # the name may hold tabs; the other fields cannot
        if len(parts) != 4:
            continue
        path, kind, size, mtime = parts
        try:
            entries[path] = RemoteEntry(path, kind, int(size), float(mtime))
        except ValueError:
            continue
    return entries


def _is_safe(path: str) -> bool:
    """A relative, canonical name (no empty, `.` or `..` parts, so not absolute either) that
    survived decoding: a name that was not UTF-8 on the node reads with U+FFFD and could not
    be asked for by name."""
    parts = path.split("/")  # not PurePosixPath: it would quietly drop `.` and `//`
    return "\ufffd" not in path and all(p not in ("..", ".", "") for p in parts)


def _plain_file(base: Path, rel: str) -> bool:
    """Whether `base/rel` is a regular file reached through real directories only.

    Checked with lstat component by component: a symlink anywhere below `base` (planted by a
    transfer or by anyone else) would make a later move read or write outside `base`.
    """
    path = base
    parts = PurePosixPath(rel).parts
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = path.lstat().st_mode
        except OSError:
            return False
        last = i == len(parts) - 1
        if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
            return False
    return True


def _safe_destination(root: Path, rel: str) -> bool:
    """Whether writing `root/rel` stays under `root`: no existing part of it is a symlink."""
    path = root
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            return False
    return not root.is_symlink()


def _hidden_temp(path: str) -> bool:
    return any(part.startswith(".tmp") for part in PurePosixPath(path).parts)


def step_of(name: str) -> int | None:
    """The step number of a `step-000123` name (its first path component), else None."""
    match = STEP_DIR.match(PurePosixPath(name).parts[0]) if name else None
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class PullPlan:
    """What one pull should fetch and which mirror step directories are now obsolete."""

    files: list[str] = field(default_factory=list)  # relative paths of regular files to pull
    complete_dirs: list[str] = field(default_factory=list)  # step dirs complete on the node
    obsolete_dirs: list[str] = field(default_factory=list)  # mirror step dirs gone on the node


def plan_pull(
    remote: Mapping[str, RemoteEntry],
    previous: Mapping[str, RemoteEntry] | None,
    mirror: Mapping[str, tuple[int, int]],
    *,
    final: bool = False,
) -> PullPlan:
    """Decide which remote files to pull now.

    `previous` is the listing of the last look (None on the first). `mirror` maps relative paths
    already mirrored to (size, integer mtime). With `final`, the writer has exited, so every
    regular file counts as stable (incomplete step dirs are still refused).
    """
    top_dirs = {p for p, e in remote.items() if e.kind == "d" and "/" not in p}
    complete = sorted(
        d for d in top_dirs if STEP_DIR.match(d) and f"{d}/{COMPLETE_MARKER}" in remote
    )
    incomplete = {d for d in top_dirs if STEP_DIR.match(d)} - set(complete)
    files: list[str] = []
    for path, entry in sorted(remote.items()):
        if entry.kind != "f" or not _is_safe(path) or _hidden_temp(path):
            continue
        top = PurePosixPath(path).parts[0]
        if top in incomplete:
            continue
        in_complete_dir = top in complete
        if not (in_complete_dir or final):
            before = previous.get(path) if previous is not None else None
            if before is None or (before.size, before.mtime) != (entry.size, entry.mtime):
                continue
        if mirror.get(path) == (entry.size, int(entry.mtime)):
            continue
        files.append(path)
    mirrored_dirs = {PurePosixPath(p).parts[0] for p in mirror if "/" in p}
    obsolete = (
        sorted(d for d in mirrored_dirs if STEP_DIR.match(d) and d not in top_dirs)
        if complete
        else []
    )
    # The marker goes last so a reader of the mirror never sees it before the files it vouches for.
    files.sort(key=lambda p: PurePosixPath(p).name == COMPLETE_MARKER)
    return PullPlan(files=files, complete_dirs=complete, obsolete_dirs=obsolete)


def scan_mirror(root: Path) -> dict[str, tuple[int, int]]:
    """(size, integer mtime) of every regular file under the mirror, by relative path."""
    found: dict[str, tuple[int, int]] = {}
    if not root.is_dir():
        return found
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = Path(dirpath) / name
            stat = full.lstat()
            if full.is_symlink():
                continue
            found[full.relative_to(root).as_posix()] = (stat.st_size, int(stat.st_mtime))
    return found


@dataclass
class PulledCheckpoint:
    """A checkpoint that became available in the mirror during one pull."""

    name: str  # step dir name or file path, relative to the mirror
    step: int | None
    size_bytes: int


class CheckpointMirror:
    """The local mirror of one job's rank-0 checkpoint directory.

    `fetch(files_from, staging)` must copy the listed remote files (relative paths, each
    ended by NUL in the file `files_from`) into `staging`, preserving relative paths and
    mtimes; it is rsync in production. Nothing outside `root` is ever written (nor moved in
    from outside): remote names with `..`, absolute paths and symlinks are refused before the
    fetch, and what the fetch delivered is installed only when it is a regular file reached
    through real directories, to a destination with no symlink on the way.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = root.parent / ".incoming"
        self._previous: dict[str, RemoteEntry] | None = None

    def pull(
        self,
        listing: Mapping[str, RemoteEntry],
        fetch: Callable[[Path, Path], None],
        *,
        final: bool = False,
    ) -> list[PulledCheckpoint]:
        plan = plan_pull(listing, self._previous, scan_mirror(self.root), final=final)
        self._previous = dict(listing)
        pulled: list[PulledCheckpoint] = []
        if plan.files:
            if self.staging.exists():
                shutil.rmtree(self.staging)
            self.staging.mkdir(parents=True)
            list_file = self.root.parent / ".incoming.list"  # NUL-separated: rsync --from0
            list_file.write_text("".join(f"{p}\0" for p in plan.files))
            fetch(list_file, self.staging)
            pulled = self._install(plan, listing)
            shutil.rmtree(self.staging, ignore_errors=True)
            list_file.unlink(missing_ok=True)
        for name in plan.obsolete_dirs:
            shutil.rmtree(self.root / name, ignore_errors=True)
        return pulled

    def _install(
        self, plan: PullPlan, listing: Mapping[str, RemoteEntry]
    ) -> list[PulledCheckpoint]:
        self.root.mkdir(parents=True, exist_ok=True)
        new_units: dict[str, int] = {}
        for rel in plan.files:
            src = self.staging / rel
            if not _plain_file(self.staging, rel):
                continue  # vanished (or became a link) since the listing; the next pull retries
            dst = self.root / rel
            if not _safe_destination(self.root, rel):
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            unit = PurePosixPath(rel).parts[0] if "/" in rel else rel
            new_units[unit] = new_units.get(unit, 0) + listing[rel].size
        result = []
        for unit, size in new_units.items():
            is_step_dir = unit in plan.complete_dirs
            if is_step_dir and not (self.root / unit / COMPLETE_MARKER).exists():
                continue
            result.append(PulledCheckpoint(unit, step_of(unit), size))
        return result

    def latest_complete(self) -> Path | None:
        """Newest complete `step-*` directory of the mirror, or None."""
        best: tuple[int, Path] | None = None
        if not self.root.is_dir():
            return None
        for child in self.root.iterdir():
            if child.is_symlink():
                continue
            step = step_of(child.name)
            complete = step is not None and (child / COMPLETE_MARKER).exists()
            if complete and (best is None or step > best[0]):  # type: ignore[operator]
                best = (step, child)  # type: ignore[assignment]
        return best[1] if best else None
