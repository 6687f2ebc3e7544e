"""rsync's running count (`--info=progress2`): read from its output, handed to a tick while it
runs, and a tick that raises stops it. Real rsync, copying between two local folders."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator.errors import RemoteError, TransferTimeout
from orchestrator.remote.sync import PROGRESS_OPTIONS, progress_bytes, run_rsync_watched


@pytest.mark.parametrize(
    ("line", "count"),
    [
        ("     22,020,096  16%   20.03MB/s    0:00:05  ", 22020096),
        ("    134.217.728 100%  914,06MB/s    0:00:00 (xfr#1, to-chk=0/2)", 134217728),
        ("         32768   0%    0.00kB/s    0:00:00", 32768),
        ("sending incremental file list", None),
        ("     22,020", None),  # a count cut before its percentage
        ("", None),
    ],
)
def test_the_count_is_read_from_a_progress_line(line: str, count: int | None) -> None:
    assert progress_bytes(line) == count


def slow_rsync(tmp_path: Path) -> str:
    """rsync capped at 12 MB/s, so a 24 MB copy runs for about 2 s."""
    wrapper = tmp_path / "rsync-slow"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("rsync")} --bwlimit=12m "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_ticks_follow_the_copy_and_end_on_its_size(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(os.urandom(3 << 20))
    (tmp_path / "src" / "b").write_bytes(os.urandom(1 << 20))
    seen: list[int] = []
    argv = ["rsync", "-a", *PROGRESS_OPTIONS, f"{tmp_path}/src/", f"{tmp_path}/dst/"]
    run_rsync_watched(argv, what="copy", tick=seen.append)
    assert seen[-1] == 4 << 20
    assert seen == sorted(seen)
    assert (tmp_path / "dst" / "a").read_bytes() == (tmp_path / "src" / "a").read_bytes()


def test_a_tick_that_raises_stops_the_copy_part_way(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big").write_bytes(os.urandom(24 << 20))

    class Stop(Exception):
        pass

    def tick(done: int) -> None:
        if done >= 4 << 20:  # its first count, after about a second
            raise Stop

    argv = [slow_rsync(tmp_path), "-a", "--partial-dir=.part", *PROGRESS_OPTIONS,
            f"{tmp_path}/src/", f"{tmp_path}/dst/"]  # fmt: skip
    with pytest.raises(Stop):
        run_rsync_watched(argv, what="copy", tick=tick)
    assert not (tmp_path / "dst" / "big").exists()
    kept = tmp_path / "dst" / ".part" / "big"
    assert 0 < kept.stat().st_size < 24 << 20


def test_a_copy_past_its_time_is_stopped(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big").write_bytes(os.urandom(24 << 20))
    argv = [slow_rsync(tmp_path), "-a", *PROGRESS_OPTIONS, f"{tmp_path}/src/", f"{tmp_path}/d/"]
    with pytest.raises(TransferTimeout, match="within 0.5 s"):
        run_rsync_watched(argv, what="copy", tick=lambda _: None, timeout=0.5)


def test_a_failed_copy_says_what_rsync_said(tmp_path: Path) -> None:
    argv = ["rsync", "-a", *PROGRESS_OPTIONS, f"{tmp_path}/missing/", f"{tmp_path}/d/"]
    with pytest.raises(RemoteError, match="copy: rsync exited 23: .*missing"):
        run_rsync_watched(argv, what="copy", tick=lambda _: None)
