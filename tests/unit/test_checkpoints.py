"""Which checkpoint files get pulled, and how the mirror is updated."""

from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.checkpoints import (
    CheckpointMirror,
    RemoteEntry,
    parse_listing,
    plan_pull,
)


def entries(*items: tuple[str, str, int, float]) -> dict[str, RemoteEntry]:
    return {p: RemoteEntry(p, k, s, m) for p, k, s, m in items}


def test_parse_listing_skips_garbage() -> None:
    text = (
        "step-000010\td\t4096\t1.5\0step-000010/state.pt\tf\t12\t2.0\0broken line\0x\tf\tNaN?\t1\0"
    )
    listing = parse_listing(text)
    assert set(listing) == {"step-000010", "step-000010/state.pt"}
    assert listing["step-000010/state.pt"].size == 12


def test_names_with_newlines_or_tabs_cannot_forge_entries() -> None:
    forged = "a\nstep-000099/COMPLETE\tf\t0\t1.0"  # one file's name, meant to look like two
    text = f"{forged}\tf\t5\t3.0\0tab\there\tf\t7\t4.0\0"
    listing = parse_listing(text)
    assert set(listing) == {forged, "tab\there"}
    assert listing[forged].size == 5 and listing["tab\there"].size == 7


def test_complete_step_dir_is_pulled_at_once_marker_last() -> None:
    remote = entries(
        ("step-000010", "d", 0, 1.0),
        ("step-000010/state.pt", "f", 100, 1.0),
        ("step-000010/COMPLETE", "f", 0, 1.0),
        ("step-000020", "d", 0, 2.0),
        ("step-000020/state.pt", "f", 50, 2.0),  # no marker yet: still being written
        (".tmp-step-000030-1", "d", 0, 3.0),
        (".tmp-step-000030-1/state.pt", "f", 5, 3.0),
    )
    plan = plan_pull(remote, None, {})
    assert plan.files == ["step-000010/state.pt", "step-000010/COMPLETE"]
    assert plan.complete_dirs == ["step-000010"]


def test_loose_file_needs_two_equal_looks() -> None:
    first = entries(("snapshot.pt", "f", 10, 1.0))
    assert plan_pull(first, None, {}).files == []
    growing = entries(("snapshot.pt", "f", 20, 2.0))
    assert plan_pull(growing, first, {}).files == []
    assert plan_pull(growing, growing, {}).files == ["snapshot.pt"]
    # Already mirrored with the same size and mtime: nothing to do.
    assert plan_pull(growing, growing, {"snapshot.pt": (20, 2)}).files == []
    # When the job has ended every file is stable.
    assert plan_pull(growing, None, {}, final=True).files == ["snapshot.pt"]


def test_unsafe_names_and_symlinks_are_never_pulled() -> None:
    remote = entries(
        ("../escape", "f", 1, 1.0),
        ("link", "l", 1, 1.0),
        ("ok", "f", 1, 1.0),
    )
    assert plan_pull(remote, remote, {}, final=True).files == ["ok"]


def test_mirror_installs_atomically_and_drops_dirs_gone_on_the_node(tmp_path: Path) -> None:
    node = tmp_path / "node"
    (node / "step-000010").mkdir(parents=True)
    (node / "step-000010" / "state.pt").write_bytes(b"a" * 100)
    (node / "step-000010" / "COMPLETE").write_bytes(b"")

    def listing() -> dict[str, RemoteEntry]:
        found = {}
        for path in sorted(node.rglob("*")):
            rel = path.relative_to(node).as_posix()
            kind = "d" if path.is_dir() else "f"
            st = path.stat()
            found[rel] = RemoteEntry(rel, kind, st.st_size, st.st_mtime)
        return found

    def fetch(files_from: Path, staging: Path) -> None:
        for rel in filter(None, files_from.read_text().split("\0")):
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(node / rel, staging / rel)

    mirror = CheckpointMirror(tmp_path / "home" / "checkpoints")
    pulled = mirror.pull(listing(), fetch)
    assert [(p.name, p.step, p.size_bytes) for p in pulled] == [("step-000010", 10, 100)]
    assert mirror.latest_complete() == mirror.root / "step-000010"
    assert mirror.pull(listing(), fetch) == []  # nothing new

    (node / "step-000020").mkdir()
    (node / "step-000020" / "state.pt").write_bytes(b"b" * 50)
    assert mirror.pull(listing(), fetch) == []  # incomplete: not taken
    (node / "step-000020" / "COMPLETE").write_bytes(b"")
    shutil.rmtree(node / "step-000010")  # the trainer keeps the last K
    pulled = mirror.pull(listing(), fetch)
    assert [p.name for p in pulled] == ["step-000020"]
    assert mirror.latest_complete() == mirror.root / "step-000020"
    assert not (mirror.root / "step-000010").exists()
    assert not mirror.staging.exists()
