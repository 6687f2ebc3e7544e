"""The mirror on the user's machine: whole checkpoints only, the previous copy kept until the new
one is in, and nothing written (or taken) outside the job's own directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.units import Unit, UnitFile


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


class Fetched:
    """Files as a transfer delivers them into the mirror's incoming area."""

    def __init__(self, mirror: CheckpointMirror) -> None:
        self.mirror = mirror
        self.count = 0

    def __call__(self, content: dict[str, bytes], kind: str, name: str) -> tuple[Unit, dict]:
        files, sources = [], {}
        for path, data in content.items():
            self.count += 1
            src = self.mirror.incoming / "r0" / f"obj{self.count}"
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_bytes(data)
            files.append(UnitFile(path, 0, digest(data), len(data), src.name, None))
            sources[path] = src
        return Unit(name, kind, tuple(files), self.count), sources


@pytest.fixture
def mirror(tmp_path: Path) -> CheckpointMirror:
    return CheckpointMirror(tmp_path / "orch" / "jobs" / "j" / "checkpoints")


def test_a_directory_checkpoint_is_installed_whole_and_indexed(mirror) -> None:
    fetch = Fetched(mirror)
    unit, sources = fetch({"step-000010/state.pt": b"w", "step-000010/COMPLETE": b""}, "step",
                          "step-000010")  # fmt: skip
    assert mirror.install(unit, sources)
    assert (mirror.root / "step-000010" / "state.pt").read_bytes() == b"w"
    assert mirror.latest_complete() == mirror.root / "step-000010"
    again = CheckpointMirror(mirror.root)  # what the next controller reads
    assert again.holds_unit(unit) and again.holds("step-000010/state.pt", digest(b"w"))


def test_a_new_version_replaces_the_old_one_only_once_it_is_whole(mirror) -> None:
    fetch = Fetched(mirror)
    v1, s1 = fetch({"ckpt/__0_0.distcp": b"a1", "ckpt/.metadata": b"m1"}, "dcp", "ckpt")
    assert mirror.install(v1, s1)
    # The next version, with one shard that never arrived: nothing of it is installed.
    v2, s2 = fetch({"ckpt/__0_0.distcp": b"a2", "ckpt/.metadata": b"m2"}, "dcp", "ckpt")
    del s2["ckpt/__0_0.distcp"]
    assert not mirror.install(v2, s2)
    assert (mirror.root / "ckpt" / "__0_0.distcp").read_bytes() == b"a1"
    assert (mirror.root / "ckpt" / ".metadata").read_bytes() == b"m1"
    v3, s3 = fetch({"ckpt/__0_0.distcp": b"a3", "ckpt/.metadata": b"m3"}, "dcp", "ckpt")
    assert mirror.install(v3, s3)
    assert (mirror.root / "ckpt" / "__0_0.distcp").read_bytes() == b"a3"


def test_a_crash_between_the_two_renames_is_mended_on_the_next_open(mirror, monkeypatch) -> None:
    fetch = Fetched(mirror)
    v1, s1 = fetch({"step-000001/state.pt": b"old", "step-000001/COMPLETE": b""}, "step",
                   "step-000001")  # fmt: skip
    assert mirror.install(v1, s1)
    v2, s2 = fetch({"step-000001/state.pt": b"new", "step-000001/COMPLETE": b""}, "step",
                   "step-000001")  # fmt: skip
    real_rename = os.rename
    calls = []

    def die_on_the_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt("the controller was killed here")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", die_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        mirror.install(v2, s2)
    monkeypatch.setattr(os, "rename", real_rename)
    assert not (mirror.root / "step-000001").exists()  # caught between the two renames
    reopened = CheckpointMirror(mirror.root)
    assert reopened.latest_complete() == mirror.root / "step-000001"
    assert (mirror.root / "step-000001" / "state.pt").read_bytes() == b"old"


def test_the_newest_directory_checkpoint_is_never_pruned(mirror) -> None:
    fetch = Fetched(mirror)
    for step in (1, 2):
        name = f"step-00000{step}"
        unit, sources = fetch({f"{name}/COMPLETE": b""}, "step", name)
        assert mirror.install(unit, sources)
    assert mirror.prune(["step-000001", "step-000002"]) == ["step-000001"]
    assert mirror.latest_complete() == mirror.root / "step-000002"


def test_a_dcp_checkpoint_that_is_the_checkpoint_directory_keeps_the_files_beside_it(
    mirror,
) -> None:
    fetch = Fetched(mirror)
    snapshot, s0 = fetch({"notes.txt": b"mine"}, "file", "notes.txt")
    assert mirror.install(snapshot, s0)
    v1, s1 = fetch({"__0_0.distcp": b"a", "__1_0.distcp": b"b", ".metadata": b"m"}, "dcp", ".")
    assert mirror.install(v1, s1)
    v2, s2 = fetch({"__0_0.distcp": b"a2", ".metadata": b"m2"}, "dcp", ".")  # fewer ranks now
    assert mirror.install(v2, s2)
    assert sorted(p.name for p in mirror.root.iterdir()) == [".metadata", "__0_0.distcp",
                                                             "notes.txt"]  # fmt: skip
    assert mirror.latest_complete() == mirror.root


def test_a_fetched_symlink_is_never_installed(mirror, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the job's")
    link = mirror.incoming / "r0" / "obj1"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    unit = Unit(
        "snapshot.pt", "file", (UnitFile("snapshot.pt", 0, digest(b"x"), 1, "obj1", None),), 1
    )
    assert not mirror.install(unit, {"snapshot.pt": link})
    assert not (mirror.root / "snapshot.pt").exists()
    assert outside.read_bytes() == b"not the job's"


def test_a_symlink_planted_in_the_mirror_is_not_written_through(mirror, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    mirror.root.mkdir(parents=True)
    (mirror.root / "step-000002").symlink_to(outside)
    fetch = Fetched(mirror)
    unit, sources = fetch({"step-000002/state.pt": b"new", "step-000002/COMPLETE": b""}, "step",
                          "step-000002")  # fmt: skip
    assert not mirror.install(unit, sources)
    assert list(outside.iterdir()) == []
    assert mirror.latest_complete() is None


def test_a_path_with_a_nul_or_control_character_is_not_installed(mirror) -> None:
    fetch = Fetched(mirror)
    for name in ("bad\x00.pt", "esc\x1b[2J.pt", "../up.pt"):
        unit, sources = fetch({name: b"x"}, "file", name)
        assert not mirror.install(unit, sources)  # never an exception
    assert mirror.units() == {}


def test_index_entries_naming_paths_outside_the_mirror_are_never_used_nor_removed(
    mirror, tmp_path: Path
) -> None:
    fetch = Fetched(mirror)
    unit, sources = fetch({"step-000002/COMPLETE": b""}, "step", "step-000002")
    assert mirror.install(unit, sources)
    victim = mirror.root.parent.parent / "victim"
    (victim / "x").mkdir(parents=True)
    index = json.loads(mirror.index_path.read_text())
    index["units"]["../../victim"] = {"kind": "step", "version": "v", "step": 1, "written_ns": 0,
                                      "files": {"../../victim/x": ["ab", 1]}}  # fmt: skip
    mirror.index_path.write_text(json.dumps(index))
    reopened = CheckpointMirror(mirror.root)
    assert set(reopened.units()) == {"step-000002"}
    assert reopened.prune(["../../victim"]) == []
    assert (victim / "x").is_dir()


def test_pruning_follows_no_symlink_planted_in_the_mirror(mirror, tmp_path: Path) -> None:
    fetch = Fetched(mirror)
    for step in (1, 2):
        unit, sources = fetch({f"a/step-00000{step}/.metadata": b"m"}, "dcp", f"a/step-00000{step}")
        assert mirror.install(unit, sources)
    outside = tmp_path / "outside"
    (outside / "step-000001").mkdir(parents=True)
    (outside / "step-000001" / "thesis.tex").write_text("keep me")
    moved = mirror.root / "a-moved"
    os.rename(mirror.root / "a", moved)
    (mirror.root / "a").symlink_to(outside)
    mirror.prune(["a/step-000001"])
    assert (outside / "step-000001" / "thesis.tex").read_text() == "keep me"
