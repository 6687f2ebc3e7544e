"""What the guard reads and writes in the job's folders, which job code owns: never through
a symlink, never a FIFO or a device, never more than a bound, never an existing file.

The guard runs here as on a node, against real files in a temporary home; what job code
would leave there is put there first.
"""

from __future__ import annotations

import json
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.node import guard, guard_files
from tests.unit.node.test_guard_program import Node

pytestmark = pytest.mark.timeout(30)  # a guard stuck on a FIFO fails here, not the suite


def test_a_file_is_read_only_when_it_is_a_regular_one_and_up_to_a_bound(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("text")
    os.mkfifo(tmp_path / "fifo")  # nobody writes it: an open for reading would wait forever
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "big").write_bytes(b"x" * (guard_files.READ_LIMIT + 10))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert guard_files.read_at(fd, "file") == "text"
        assert guard_files.read_at(fd, "fifo") is None
        assert guard_files.read_at(fd, "link") is None
        assert guard_files.read_at(fd, "missing") is None
        assert len(guard_files.read_at(fd, "big") or "") == guard_files.READ_LIMIT
    finally:
        os.close(fd)


def test_a_write_replaces_a_planted_symlink_and_leaves_its_target_alone(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "status.json").symlink_to(target)
    (folder / "status.json.tmp").symlink_to(target)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        guard_files.write_at(fd, "status.json", "{}", mode=0o640)
    finally:
        os.close(fd)
    assert target.read_text() == "precious"
    written = folder / "status.json"
    assert not written.is_symlink() and written.read_text() == "{}"
    assert stat.S_IMODE(written.stat().st_mode) == 0o640
    assert sorted(p.name for p in folder.iterdir()) == ["status.json", "status.json.tmp"]


def test_a_folder_is_never_reached_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real/inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.close(guard_files.open_dir(str(tmp_path), ("real", "inner")))
    with pytest.raises(OSError):
        guard_files.open_dir(str(tmp_path), ("link", "inner"))
    with pytest.raises(OSError):
        guard_files.open_dir(str(tmp_path), ("link", "new"), make=(0o755, None))
    assert not (tmp_path / "real/new").exists()


def test_the_guards_own_folder_is_refused_when_it_is_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        guard_files.own_dir(str(tmp_path / "state"))
    fd = guard_files.own_dir(str(tmp_path / "own"))
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "own").stat().st_mode) == 0o700


def test_a_guard_is_not_held_up_by_a_fifo_where_the_run_writes_its_pid(tmp_path: Path) -> None:
    """Job code that turns run/pid into a FIFO: the run counts as started with no process of
    its own to stop, so the limit is still acted on."""
    node = Node(tmp_path, runtime_deadline=datetime.fromtimestamp(time.time() - 30, UTC))
    node.heartbeat(age_s=60)
    os.mkfifo(node.run_dir / "pid")
    os.mkfifo(tmp_path / node.layout.lease)
    assert node.guard.due(time.time())[0] == "max_runtime"


def test_a_guard_writes_its_reports_past_symlinks_job_code_left(tmp_path: Path) -> None:
    """Symlinks where the guard writes its status and decision (and their old temporary
    names) lead it nowhere: their targets stay as they were, the reports land in the job's
    guard/ folder and in the guard's own."""
    node = Node(tmp_path)
    folder = tmp_path / node.layout.root
    target = tmp_path / "target"
    target.write_text("precious")
    for name in ("status.json", "status.json.tmp", "decision.json", "decision.json.tmp"):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(target)
    node.guard.status()
    node.guard.report(guard.DECISION, {"kind": "max_runtime"})
    assert target.read_text() == "precious"
    for where in (folder, tmp_path / "state"):
        assert json.loads((where / "status.json").read_text())["pid"] == os.getpid()
        assert json.loads((where / guard.DECISION).read_text()) == {"kind": "max_runtime"}
    assert stat.S_IMODE((tmp_path / "state/status.json").stat().st_mode) == 0o600
