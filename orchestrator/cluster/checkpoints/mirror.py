"""The mirror: the copy of a job's checkpoints on the user's machine (ORCH_HOME/jobs/<id>/).

The mirror holds complete checkpoints only (`units.Unit`), laid out as
under the job's checkpoint directory on the nodes, and an index beside it (`checkpoints.json`:
every checkpoint it holds, each file's digest) so that nothing is fetched twice.

Installing is atomic per checkpoint. A file is renamed over its previous copy. A directory is
built whole next to the mirror (from the fetched files, and hard links of files it already
has), then swapped in with two renames; the previous copy stays readable until then, and one
caught between the two renames by a crash is put back when the mirror is next opened. So a
reader, a restart or a push never sees a checkpoint that is half there.

Nothing outside the mirror is ever written, removed or moved in from outside: every path
(from a node, or from the index) must be a safe checkpoint path (`checkpoint_protocol.safe_path`:
canonical, relative, no control character); fetched files are taken only when they are regular
files reached through real directories, installed only where no part of the destination is a
symlink, and pruned only the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from orchestrator.atomic import write_atomic
from orchestrator.cluster.checkpoints.units import Unit, UnitFile, directory_of, newer
from orchestrator.node.checkpoint_files import COMPLETE_MARKER, DCP_METADATA
from orchestrator.node.checkpoint_protocol import safe_path

INDEX_VERSION = 1


@dataclass(frozen=True)
class MirroredUnit:
    """A checkpoint the mirror holds, as its index records it."""

    name: str
    kind: str  # step | dcp | file
    version: str
    step: int | None
    written_ns: int
    files: Mapping[str, tuple[str, int]]  # path -> (digest, size)

    @property
    def directory(self) -> str | None:
        return directory_of(self.kind, self.name)

    @property
    def order(self) -> tuple[int, int]:
        """Sorts like `checkpoint_units.newer`: by step, then by time."""
        return (-1 if self.step is None else self.step, self.written_ns)


def plain_file(base: Path, rel: str) -> bool:
    """Whether `base/rel` is a regular file reached through real directories only (checked
    with lstat part by part: a symlink anywhere would let a later move escape `base`)."""
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


def _no_symlink_on_the_way(root: Path, rel: str) -> bool:
    """Whether writing (or removing) `root/rel` stays under `root`: `rel` is a safe checkpoint
    path and no existing part of it is a symlink."""
    if root.is_symlink() or not safe_path(rel):
        return False
    path = root
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            return False
    return True


def _marker_last(files: list[UnitFile]) -> list[UnitFile]:
    return sorted(
        files, key=lambda f: PurePosixPath(f.path).name in (COMPLETE_MARKER, DCP_METADATA)
    )


class CheckpointMirror:
    """The mirror of one job (see the module docstring). Not thread-safe: one collector writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.index_path = root.parent / "checkpoints.json"
        self.incoming = root.parent / ".incoming"
        self._retired = root.parent / ".retired"
        self._units: dict[str, MirroredUnit] = {}
        self._loaded = False

    # --- the index ----------------------------------------------------------------------------
    def units(self) -> dict[str, MirroredUnit]:
        if not self._loaded:
            self._recover()
            self._units = self._read_index()
            self._loaded = True
        return self._units

    def _read_index(self) -> dict[str, MirroredUnit]:
        try:
            document = json.loads(self.index_path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(document, dict) or document.get("version") != INDEX_VERSION:
            return {}
        units: dict[str, MirroredUnit] = {}
        for name, entry in (document.get("units") or {}).items():
            if not (name == "." or safe_path(name)):
                continue  # not a name this mirror writes: nothing of it is used, or removed
            try:
                units[name] = MirroredUnit(
                    name=name,
                    kind=entry["kind"],
                    version=entry["version"],
                    step=entry.get("step"),
                    written_ns=int(entry.get("written_ns", 0)),
                    files={p: (f[0], int(f[1])) for p, f in entry["files"].items()},
                )
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if not all(safe_path(path) for path in units[name].files):
                del units[name]
        return units

    def _write_index(self) -> None:
        document = {
            "version": INDEX_VERSION,
            "units": {
                u.name: {
                    "kind": u.kind,
                    "version": u.version,
                    "step": u.step,
                    "written_ns": u.written_ns,
                    "files": {p: list(f) for p, f in u.files.items()},
                }
                for u in self._units.values()
            },
        }
        self.index_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.index_path, json.dumps(document))

    def holds(self, path: str, digest: str) -> bool:
        """Whether the mirror has this content at this path (no need to fetch it again)."""
        return any(u.files.get(path, ("",))[0] == digest for u in self.units().values())

    def holds_unit(self, unit: Unit) -> bool:
        held = self.units().get(unit.name)
        return held is not None and held.version == unit.version

    def files(self) -> dict[str, tuple[str, int]]:
        """Every file the mirror holds: path -> (digest, size)."""
        found: dict[str, tuple[str, int]] = {}
        for unit in self.units().values():
            found.update(unit.files)
        return found

    def newest_directory(self, skip: Collection[tuple[str, str]] = ()) -> MirroredUnit | None:
        """The newest directory checkpoint the mirror holds whole: what a restart resumes from
        (never a version in `skip`: (name, version) pairs)."""
        best: MirroredUnit | None = None
        for unit in self.units().values():
            if unit.kind == "file" or (unit.name, unit.version) in skip:
                continue
            marker = COMPLETE_MARKER if unit.kind == "step" else DCP_METADATA
            directory = self.root / unit.directory if unit.directory else self.root
            if not (directory / marker).is_file():
                continue
            if best is None or unit.order > best.order:
                best = unit
        return best

    def latest_complete(self) -> Path | None:
        """The newest directory checkpoint on disk, or None."""
        unit = self.newest_directory()
        if unit is None:
            return None
        return self.root / unit.directory if unit.directory else self.root

    # --- installing -------------------------------------------------------------------------
    def install(self, unit: Unit, fetched: Mapping[str, Path]) -> bool:
        """Install a complete checkpoint from `fetched` (path -> a fetched file under
        `incoming`) and files the mirror already holds; True when it is in place.

        False, and the mirror unchanged, when a file is missing, not a plain file, or its
        destination would leave the mirror."""
        self.units()
        sources: dict[str, Path] = {}
        have = self.files()
        for f in unit.files:
            src = fetched.get(f.path)
            if src is not None:
                if not plain_file(self.incoming, src.relative_to(self.incoming).as_posix()):
                    return False
            elif have.get(f.path, ("",))[0] == f.digest and plain_file(self.root, f.path):
                src = self.root / f.path
            else:
                return False
            if not _no_symlink_on_the_way(self.root, f.path):
                return False
            sources[f.path] = src
        if unit.kind == "file":
            self._install_file(unit.files[0].path, sources[unit.files[0].path])
        else:
            self._install_directory(unit, sources)
        self._units[unit.name] = MirroredUnit(
            name=unit.name,
            kind=unit.kind,
            version=unit.version,
            step=unit.step,
            written_ns=unit.written_ns,
            files={f.path: (f.digest, f.size) for f in unit.files},
        )
        self._write_index()
        return True

    def _scratch(self) -> Path:
        path = self.incoming / "build" / uuid.uuid4().hex
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _install_file(self, rel: str, src: Path) -> None:
        dst = self.root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)  # a directory of that name once: the file is newer
        tmp = self._scratch()
        os.link(src, tmp)
        os.replace(tmp, dst)

    def _install_directory(self, unit: Unit, sources: Mapping[str, Path]) -> None:
        directory = unit.directory or ""
        target = self.root / directory if directory else self.root
        build = self._scratch()
        build.mkdir()
        members = set()
        for f in _marker_last(list(unit.files)):
            inside = f.path[len(directory) + 1 :] if directory else f.path
            members.add(inside)
            dst = build / inside
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(sources[f.path], dst)
        if unit.kind == "dcp" and target.is_dir():
            # A DCP checkpoint is the files right in its directory; what lies deeper (other
            # checkpoints, when it is the checkpoint directory itself) moves with it.
            for child in target.iterdir():
                if child.name in members or not child.is_dir() or child.is_symlink():
                    continue
                shutil.copytree(child, build / child.name, symlinks=True, copy_function=os.link)
            if not directory:
                # Files beside it are other checkpoints (single files) unless its previous
                # version held them.
                earlier = self._direct_files_of(unit)
                for child in target.iterdir():
                    plain = child.is_file() and not child.is_symlink()
                    if plain and child.name not in members and child.name not in earlier:
                        os.link(child, build / child.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        self._swap(build, target)

    def _direct_files_of(self, unit: Unit) -> set[str]:
        """The files right in a DCP directory that an earlier version of it held."""
        held = self._units.get(unit.name)
        if held is None:
            return set()
        directory = held.directory or ""
        return {
            p[len(directory) + 1 :] if directory else p
            for p in held.files
            if "/" not in (p[len(directory) + 1 :] if directory else p)
        }

    def _swap(self, build: Path, target: Path) -> None:
        """Put `build` where `target` is, keeping the old `target` until the new one is there.

        A crash between the two renames leaves the old one under `.retired/` with a note of
        where it belongs; `_recover` puts it back."""
        if not target.exists():
            os.rename(build, target)
            return
        slot = self._retired / hashlib.sha256(str(target).encode()).hexdigest()[:16]
        self._retired.mkdir(parents=True, exist_ok=True)
        if slot.exists():
            shutil.rmtree(slot)
        slot.with_suffix(".target").write_text(str(target))
        os.rename(target, slot)
        os.rename(build, target)
        shutil.rmtree(slot, ignore_errors=True)
        slot.with_suffix(".target").unlink(missing_ok=True)

    def _recover(self) -> None:
        if not self._retired.is_dir():
            return
        for note in self._retired.glob("*.target"):
            slot = note.with_suffix("")
            target = Path(note.read_text())
            inside = target == self.root or target.is_relative_to(self.root)
            if inside and slot.is_dir() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(slot, target)
            shutil.rmtree(slot, ignore_errors=True)
            note.unlink(missing_ok=True)

    # --- pruning ----------------------------------------------------------------------------
    def prune(self, names: list[str]) -> list[str]:
        """Remove these directory checkpoints; the newest one is always kept. Returns what
        was removed."""
        newest = self.newest_directory()
        removed = []
        for name in names:
            unit = self.units().get(name)
            if unit is None or unit.kind == "file" or (newest and unit.name == newest.name):
                continue
            if unit.directory:
                if _no_symlink_on_the_way(self.root, unit.directory):
                    shutil.rmtree(self.root / unit.directory, ignore_errors=True)
            else:
                for path in unit.files:
                    if _no_symlink_on_the_way(self.root, path):
                        with contextlib.suppress(OSError):
                            (self.root / path).unlink()
            del self._units[name]
            removed.append(name)
        if removed:
            self._write_index()
        return removed

    def clear_incoming(self) -> None:
        shutil.rmtree(self.incoming, ignore_errors=True)


def newest(units: list[Unit]) -> Unit | None:
    """The newest directory checkpoint of `units`, or None."""
    directories = [u for u in units if u.kind != "file"]
    return max(directories, key=newer) if directories else None
