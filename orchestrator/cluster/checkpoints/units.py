"""Which complete checkpoints a job's nodes hold, from what their checkpoint agents staged.

Pure: it reads the nodes' manifests (`orchestrator.node.checkpoint_protocol`) and says which
checkpoints are complete, so that the collector knows what to bring home, the ledger what to
record and a restart what to resume from. A checkpoint (a "unit") is one of:

- **a step directory** of orch's trainer contract, `step-N/` at the top of the checkpoint
  directory: complete once its `COMPLETE` marker is staged and every file of it, on every node
  that answered, is staged and unchanged since;
- **a DCP directory**, any directory holding `.metadata` (the file DCP's coordinator writes
  last, after every rank wrote its shards on its own node): complete when its `.metadata` is
  staged and unchanged, and every shard file the metadata names is staged and unchanged on
  some node, at least as long as the metadata says, and not written after the metadata (mtimes
  brought onto the controller's clock, within `CLOCK_SLACK_NS`). So a directory a script saves
  into again, in place, is never taken half old and half new. When the metadata cannot be
  read, every node must answer and every file of the directory be staged and unchanged;
- **any other file** (`snapshot.pt` saved in place): complete once one node has a staged copy
  that still holds what was staged. The lowest rank that has one gives it.

Files of a `step-N/` directory without its marker, and DCP shards in a directory without
`.metadata`, belong to a checkpoint still being written: they are never taken one by one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from orchestrator.node.checkpoint_files import COMPLETE_MARKER, DCP_METADATA, DCP_SHARD, STEP_DIR
from orchestrator.node.checkpoint_protocol import NodeFile, NodeManifest

CLOCK_SLACK_NS = 250_000_000  # how far two nodes' clocks may disagree after the offset is taken
LATEST_POINTER = "latest"  # the trainer's pointer to its newest checkpoint, not one itself
_STEP_NAME = re.compile(r"^(?:step|global_step|checkpoint|ckpt|iter|iteration|epoch)[-_]?(\d+)$")


def step_of(name: str) -> int | None:
    """The step a checkpoint's name gives (`step-000120`, `checkpoint-500`, `epoch_3`), else
    None. Only the name's last part counts."""
    match = _STEP_NAME.match(PurePosixPath(name).name) if name and name != "." else None
    return int(match.group(1)) if match else None


def directory_of(kind: str, name: str) -> str | None:
    """A checkpoint's directory relative to the checkpoint directory ('' for the directory
    itself, named '.'); None for a single-file checkpoint."""
    if kind == "file":
        return None
    return "" if name == "." else name


@dataclass(frozen=True)
class UnitFile:
    """One file of a complete checkpoint and where its staged copy is."""

    path: str  # relative to the checkpoint directory
    rank: int  # the node that holds the copy
    digest: str
    size: int
    object: str | None  # the staged copy's name on that node (None: orch restored it there)
    stored: str | None  # its key in the store, once uploaded
    linked: bool = False  # the copy is a hard link to the node's file (see NodeFile.usable)
    mtime_ns: int = 0  # the file's mtime when staged, on that node's clock
    ctime_ns: int = 0  # and its ctime (see StagedCopy)


@dataclass(frozen=True)
class Unit:
    """A complete checkpoint: a directory (`step`, `dcp`) or a single file (`file`)."""

    name: str  # the directory ('.' for the checkpoint directory itself) or the file's path
    kind: str  # step | dcp | file
    files: tuple[UnitFile, ...]  # the marker (COMPLETE, .metadata) last
    written_ns: int  # when its newest file was written, on the controller's clock

    @property
    def directory(self) -> str | None:
        return directory_of(self.kind, self.name)

    @property
    def step(self) -> int | None:
        return step_of(self.name)

    @property
    def version(self) -> str:
        """A digest of what the checkpoint holds: its files' paths and contents."""
        digest = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.path):
            digest.update(f"{f.path}\0{f.digest}\n".encode())
        return digest.hexdigest()

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stored(self) -> bool:
        """Every file of it is in the store."""
        return all(f.stored for f in self.files)


def newer(unit: Unit) -> tuple[int, int]:
    """Sort key of directory checkpoints: by step where the name has one, then by time."""
    step = unit.step
    return (-1 if step is None else step, unit.written_ns)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def _member(path: str, rank: int, node_file: NodeFile) -> UnitFile:
    staged = node_file.staged
    assert staged is not None  # callers pass settled or usable files only
    return UnitFile(
        path, rank, staged.digest, staged.size, staged.object, staged.stored,
        staged.linked, staged.mtime_ns, staged.ctime_ns,
    )  # fmt: skip


def _controller_ns(manifest: NodeManifest, node_ns: int) -> int:
    return node_ns - manifest.clock_offset_ns


def find_units(manifests: Mapping[int, NodeManifest], ranks: Collection[int]) -> list[Unit]:
    """Every complete checkpoint the answering nodes (`manifests`, by rank) hold; `ranks` are
    all the cluster's nodes, answering or not. Directory checkpoints first, newest last."""
    everyone = all(rank in manifests for rank in ranks)
    holders: dict[str, dict[int, NodeFile]] = {}
    for rank in sorted(manifests):
        for path, node_file in manifests[rank].files.items():
            holders.setdefault(path, {})[rank] = node_file
    dcp_dirs = {d for m in manifests.values() for d in m.dcp}
    for path in holders:
        name = PurePosixPath(path).name
        if name == DCP_METADATA or DCP_SHARD.match(name):
            dcp_dirs.add(_parent(path))
    step_dirs = {
        path.split("/", 1)[0]
        for path in holders
        if "/" in path and STEP_DIR.match(path.split("/", 1)[0])
    } - dcp_dirs

    units: list[Unit] = []
    for directory in sorted(dcp_dirs):
        unit = _dcp_unit(directory, manifests, holders, everyone)
        if unit is not None:
            units.append(unit)
    for directory in sorted(step_dirs):
        unit = _step_unit(directory, manifests, holders)
        if unit is not None:
            units.append(unit)
    units.sort(key=newer)
    for path, by_rank in sorted(holders.items()):
        if _parent(path) in dcp_dirs or ("/" in path and path.split("/", 1)[0] in step_dirs):
            continue  # part of a directory checkpoint, complete or not
        for rank in sorted(by_rank):
            if by_rank[rank].usable is not None:
                member = _member(path, rank, by_rank[rank])
                written = _controller_ns(manifests[rank], by_rank[rank].staged.mtime_ns)  # type: ignore[union-attr]
                units.append(Unit(path, "file", (member,), written))
                break
    return units


def _lowest_settled(by_rank: Mapping[int, NodeFile]) -> int | None:
    return next((rank for rank in sorted(by_rank) if by_rank[rank].settled), None)


def _dcp_unit(
    directory: str,
    manifests: Mapping[int, NodeManifest],
    holders: Mapping[str, Mapping[int, NodeFile]],
    everyone: bool,
) -> Unit | None:
    metadata_path = _join(directory, DCP_METADATA)
    by_rank = holders.get(metadata_path, {})
    meta_rank = next(
        (
            rank
            for rank in sorted(by_rank)
            if by_rank[rank].settled
            and directory in manifests[rank].dcp
            and manifests[rank].dcp[directory].metadata_digest == by_rank[rank].staged.digest  # type: ignore[union-attr]
        ),
        None,
    )
    if meta_rank is None:
        return None
    metadata = by_rank[meta_rank]
    written = _controller_ns(manifests[meta_rank], metadata.mtime_ns)
    expected = manifests[meta_rank].dcp[directory].files
    direct = {
        path: files
        for path, files in holders.items()
        if _parent(path) == directory and path != metadata_path
    }
    members: list[UnitFile] = []

    def settled_member(path: str, least: int) -> UnitFile | None:
        for rank in sorted(direct.get(path, {})):
            node_file = direct[path][rank]
            in_time = (
                _controller_ns(manifests[rank], node_file.mtime_ns) <= written + CLOCK_SLACK_NS
            )
            if node_file.settled and node_file.size >= least and in_time:
                return _member(path, rank, node_file)
        return None

    if expected is None:
        if not everyone:
            return None
        for path in sorted(direct):
            member = settled_member(path, 0)
            if member is None:
                return None
            members.append(member)
    else:
        for name, least in sorted(expected.items()):
            member = settled_member(_join(directory, name), least)
            if member is None:
                return None
            members.append(member)
        named = {_join(directory, name) for name in expected}
        for path in sorted(set(direct) - named):  # the script's own extras, when settled
            member = settled_member(path, 0)
            if member is not None and not DCP_SHARD.match(PurePosixPath(path).name):
                members.append(member)
    members.append(_member(metadata_path, meta_rank, metadata))
    return Unit(directory or ".", "dcp", tuple(members), written)


def _step_unit(
    directory: str,
    manifests: Mapping[int, NodeManifest],
    holders: Mapping[str, Mapping[int, NodeFile]],
) -> Unit | None:
    marker = f"{directory}/{COMPLETE_MARKER}"
    if _lowest_settled(holders.get(marker, {})) is None:
        return None
    members: list[UnitFile] = []
    written = 0
    for path in sorted(p for p in holders if p.startswith(directory + "/")):
        rank = _lowest_settled(holders[path])
        if rank is None:
            return None  # a file of it is still being written, or changed since
        node_file = holders[path][rank]
        members.append(_member(path, rank, node_file))
        written = max(written, _controller_ns(manifests[rank], node_file.mtime_ns))
    members.sort(key=lambda f: f.path == marker)
    return Unit(directory, "step", tuple(members), written)


def present_directories(
    manifests: Mapping[int, NodeManifest], ranks: Collection[int]
) -> set[str] | None:
    """The directory checkpoints (names as in `Unit.name`) that some node still holds files
    of; None unless every node answered, since a silent node may hold any."""
    if not all(rank in manifests for rank in ranks):
        return None
    present: set[str] = set()
    for manifest in manifests.values():
        for path in manifest.files:
            top = path.split("/", 1)[0]
            if "/" in path and STEP_DIR.match(top):
                present.add(top)
            parent = _parent(path)
            present.add(parent or ".")
    return present
