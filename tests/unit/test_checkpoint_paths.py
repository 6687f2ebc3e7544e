"""Checkpoint pulls never write (or take files from) outside the job's own directory.

The node's listing is untrusted: names with `..`, absolute names, symlinks and names made to
look like several entries are refused before anything is fetched. What the transfer delivers
is untrusted too: a staging area holding symlinks (what a compromised transfer could leave) is
never followed when the mirror is updated. Real pulls over rsync from a node are in
tests/integration/test_checkpoint_pull_paths.py.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.checkpoints import CheckpointMirror, RemoteEntry, plan_pull

UNSAFE_NAMES = [
    "../escape",
    "../../jobs/other/checkpoints/x",
    "/etc/passwd",
    "step-000001/../../x",
    "./x",
    "a//b",
    "a/./b",
    "..",
    ".",
    "",
    "bad\ufffdname",  # not UTF-8 on the node: cannot be asked for by name
]


def entries(*items: tuple[str, str, int, float]) -> dict[str, RemoteEntry]:
    return {p: RemoteEntry(p, k, s, m) for p, k, s, m in items}


def test_unsafe_names_are_never_planned() -> None:
    remote = entries(*[(name, "f", 1, 1.0) for name in UNSAFE_NAMES], ("ok", "f", 1, 1.0))
    assert plan_pull(remote, remote, {}, final=True).files == ["ok"]


def test_only_regular_files_are_planned() -> None:
    remote = entries(
        ("link-to-etc", "l", 4, 1.0),
        ("dir", "d", 0, 1.0),
        ("fifo", "p", 0, 1.0),
        ("socket", "s", 0, 1.0),
        ("file", "f", 1, 1.0),
    )
    assert plan_pull(remote, remote, {}, final=True).files == ["file"]


def test_a_step_dir_that_is_a_symlink_is_not_complete() -> None:
    remote = entries(
        ("step-000001", "l", 0, 1.0),  # a link to a complete checkpoint elsewhere
        ("step-000001/state.pt", "f", 5, 1.0),
        ("step-000001/COMPLETE", "f", 0, 1.0),
    )
    plan = plan_pull(remote, remote, {}, final=True)
    assert plan.complete_dirs == []


names = st.lists(
    st.sampled_from(["..", ".", "", "a", "b", "step-000001", "/", "~", "\ufffd", " ", "\n"]),
    min_size=1,
    max_size=5,
).map("/".join) | st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(listing=st.lists(st.tuples(names, st.sampled_from(["f", "d", "l"])), max_size=8))
def test_every_planned_file_stays_inside_the_mirror(listing: list[tuple[str, str]]) -> None:
    remote = entries(*[(name, kind, 1, 1.0) for name, kind in listing])
    root = "/orch/jobs/j/checkpoints"
    for rel in plan_pull(remote, remote, {}, final=True).files:
        joined = posixpath.normpath(posixpath.join(root, rel))
        assert joined.startswith(root + "/"), rel
        assert posixpath.join(root, rel) == joined, rel  # nothing for the OS to resolve


# --------------------------------------------------------------------------------------------
# A transfer that delivers symlinks


def _mirror_and_outside(tmp_path: Path) -> tuple[CheckpointMirror, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "state.pt").write_bytes(b"not the job's")
    (outside / "COMPLETE").write_bytes(b"")
    return CheckpointMirror(tmp_path / "orch" / "jobs" / "j" / "checkpoints"), outside


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _fetch_planting(plant: Callable[[Path], None]) -> Callable[[Path, Path], None]:
    def fetch(files_from: Path, staging: Path) -> None:
        plant(staging)

    return fetch


def test_a_symlinked_directory_in_staging_is_not_followed(tmp_path: Path) -> None:
    mirror, outside = _mirror_and_outside(tmp_path)
    before = _snapshot(outside)
    listing = entries(
        ("step-000001", "d", 0, 1.0),
        ("step-000001/state.pt", "f", 13, 1.0),
        ("step-000001/COMPLETE", "f", 0, 1.0),
    )
    pulled = mirror.pull(
        listing, _fetch_planting(lambda s: (s / "step-000001").symlink_to(outside)), final=True
    )
    assert pulled == []
    assert _snapshot(outside) == before  # nothing was moved out of it
    assert not (mirror.root / "step-000001" / "state.pt").exists()
    assert mirror.latest_complete() is None


def test_a_symlinked_file_in_staging_is_not_installed(tmp_path: Path) -> None:
    mirror, outside = _mirror_and_outside(tmp_path)
    listing = entries(("snapshot.pt", "f", 13, 1.0))
    mirror.pull(
        listing,
        _fetch_planting(lambda s: (s / "snapshot.pt").symlink_to(outside / "state.pt")),
        final=True,
    )
    assert not (mirror.root / "snapshot.pt").exists()
    assert not (mirror.root / "snapshot.pt").is_symlink()
    assert (outside / "state.pt").read_bytes() == b"not the job's"


def test_a_symlink_inside_the_mirror_is_not_written_through(tmp_path: Path) -> None:
    mirror, outside = _mirror_and_outside(tmp_path)
    mirror.root.mkdir(parents=True)
    (mirror.root / "step-000002").symlink_to(outside)  # planted by someone else

    def fetch(files_from: Path, staging: Path) -> None:
        (staging / "step-000002").mkdir()
        (staging / "step-000002" / "state.pt").write_bytes(b"new")

    listing = entries(("step-000002", "d", 0, 1.0), ("step-000002/state.pt", "f", 3, 1.0))
    mirror.pull(listing, fetch, final=True)
    assert (outside / "state.pt").read_bytes() == b"not the job's"
    assert mirror.latest_complete() is None  # a linked step dir is never resumed from


def test_latest_pointer_is_a_plain_file_and_never_followed(tmp_path: Path) -> None:
    mirror, outside = _mirror_and_outside(tmp_path)

    def fetch(files_from: Path, staging: Path) -> None:
        for rel in filter(None, files_from.read_text().split("\0")):
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"../../outside\n" if rel == "latest" else b"x")

    listing = entries(
        ("latest", "f", 14, 1.0),
        ("step-000003", "d", 0, 1.0),
        ("step-000003/state.pt", "f", 1, 1.0),
        ("step-000003/COMPLETE", "f", 1, 1.0),
    )
    names = sorted(p.name for p in mirror.pull(listing, fetch, final=True))
    assert names == ["latest", "step-000003"]
    assert (mirror.root / "latest").read_bytes() == b"../../outside\n"
    assert not (mirror.root / "latest").is_symlink()
    assert mirror.latest_complete() == mirror.root / "step-000003"
    job_dir = mirror.root.parent
    written = set((tmp_path / "orch").rglob("*")) - {job_dir, *job_dir.parents}
    assert all(job_dir in p.parents for p in written), written
    assert not (tmp_path / "orch" / "outside").exists()


def test_an_obsolete_step_dir_that_became_a_link_is_not_emptied(tmp_path: Path) -> None:
    mirror, outside = _mirror_and_outside(tmp_path)
    mirror.root.mkdir(parents=True)
    (mirror.root / "step-000001").symlink_to(outside)
    (mirror.root / "step-000002").mkdir()
    (mirror.root / "step-000002" / "COMPLETE").write_bytes(b"")

    def fetch(files_from: Path, staging: Path) -> None:
        for rel in filter(None, files_from.read_text().split("\0")):
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(b"y")

    listing = entries(
        ("step-000005", "d", 0, 1.0),
        ("step-000005/COMPLETE", "f", 1, 1.0),
    )
    mirror.pull(listing, fetch, final=True)
    assert sorted(os.listdir(outside)) == ["COMPLETE", "state.pt"]
    shutil.rmtree(tmp_path / "orch")
