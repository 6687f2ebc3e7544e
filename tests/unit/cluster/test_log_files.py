"""The cap and rotation of mirrored node logs: the pure decision, and files on a real disk;
reading them back in bounded pieces."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.cluster import log_files
from orchestrator.cluster.log_lines import READ_CHUNK, LogReader
from orchestrator.config import load_settings
from orchestrator.remote.lines import CUT_KEEP, CUT_MARK, DEFAULT_MAX_LINE


def test_a_log_rotates_only_when_it_holds_something_and_would_pass_the_cap() -> None:
    assert not log_files.needs_rotation(0, 10, 100)
    assert not log_files.needs_rotation(90, 10, 100)
    assert log_files.needs_rotation(90, 11, 100)
    assert log_files.needs_rotation(1, 500, 100)  # a big append goes into a fresh file
    assert not log_files.needs_rotation(0, 500, 100)  # ... whole, even above the cap
    assert not log_files.needs_rotation(10**9, 10**9, 0)  # 0: no cap


def test_a_rotation_shifts_every_kept_file_up_and_drops_the_oldest() -> None:
    assert log_files.rotation_moves("node-0.log", 3) == [
        ("node-0.log.3", None),
        ("node-0.log.2", "node-0.log.3"),
        ("node-0.log.1", "node-0.log.2"),
        ("node-0.log", "node-0.log.1"),
    ]
    assert log_files.rotation_moves("node-0.log", 1) == [
        ("node-0.log.1", None),
        ("node-0.log", "node-0.log.1"),
    ]
    assert log_files.rotation_moves("node-0.log", 0) == [("node-0.log", None)]


def test_the_stream_keeps_its_positions_across_rotations(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    chunks = [f"chunk {n}\n".encode() * 3 for n in range(6)]  # 24 bytes each
    for chunk in chunks:
        log_files.append(log, chunk, max_bytes=40, keep=2)
    assert [p.name for p in log_files.log_parts(log)] == [
        "node-0.log.2",
        "node-0.log.1",
        "node-0.log",
    ]
    assert all(p.stat().st_size <= 40 for p in log_files.log_parts(log))
    assert log_files.logical_size(log) == 6 * 24
    # what is kept reads in order; what was dropped is skipped, not invented
    assert log_files.read_from(log, 0) == (3 * 24, b"".join(chunks[3:]))
    assert log_files.read_from(log, 4 * 24 + 5) == (4 * 24 + 5, b"".join(chunks[4:])[5:])
    assert log_files.read_from(log, 6 * 24) == (6 * 24, b"")


def test_the_cap_and_the_kept_files_are_settings(tmp_path: Path) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    assert (settings.logs.max_bytes, settings.logs.keep) == (50 * 1024 * 1024, 3)
    env = {"ORCH_HOME": str(tmp_path), "ORCH_LOGS_MAX_BYTES": "1024", "ORCH_LOGS_KEEP": "1"}
    assert (load_settings(env).logs.max_bytes, load_settings(env).logs.keep) == (1024, 1)


def test_each_pull_records_its_time_and_rotation_forgets_what_no_file_keeps(
    tmp_path: Path,
) -> None:
    log = tmp_path / "node-0.log"
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for n in range(6):  # 24 bytes a pull, at minutes 0..5
        at = start + timedelta(minutes=n)
        log_files.append(log, f"chunk {n}\n".encode() * 3, max_bytes=40, keep=2, pulled_at=at)
    times = log_files.pull_times(log)
    first, _ = log_files.read_from(log, 0)
    assert first == 3 * 24  # the kept files start at pull 3 ...
    assert [p for p, _ in times] == [3 * 24, 4 * 24, 5 * 24]  # ... and so do the records
    assert log_files.time_at(times, 3 * 24 + 10) == start + timedelta(minutes=3)
    assert log_files.time_at(times, 6 * 24 - 1) == start + timedelta(minutes=5)
    assert log_files.time_at(times, 0) is None
    log_files.append(log, b"no time\n", max_bytes=0, keep=2)  # a pull without a time
    assert len(log_files.pull_times(log)) == 3


def test_a_bounded_read_returns_only_what_it_asks_for_across_parts(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    chunks = [f"chunk {n}\n".encode() * 3 for n in range(6)]  # 24 bytes each
    for chunk in chunks:
        log_files.append(log, chunk, max_bytes=40, keep=2)
    whole = b"".join(chunks[3:])
    assert log_files.read_from(log, 0, 30) == (3 * 24, whole[:30])  # two files, 30 bytes
    assert log_files.read_from(log, 3 * 24 + 30, 1000) == (3 * 24 + 30, whole[30:])
    assert log_files.read_from(log, 3 * 24 + 7, 0) == (3 * 24 + 7, b"")


def test_a_line_that_never_ends_is_read_once_cut_and_in_bounded_memory(tmp_path: Path) -> None:
    """A node log holding 64 MiB without a newline: `orch logs -f` shows it once, cut, while it
    is still being written, holds no more of it than the line cap, and goes on with the next
    lines; progress-bar redraws after a carriage return are lines of their own; the node's
    control characters never reach the terminal."""
    log = tmp_path / "node-0.log"
    with log.open("wb") as handle:
        handle.write(b"[default0]:start\n[default0]:")
        for _ in range(64):
            handle.write(b"z" * 1024 * 1024)
    reader = LogReader(log, node=0, gpus_per_node=1)
    tracemalloc.start()
    try:
        first = reader.read(final=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [line.text for line in first] == [
        "start",
        "z" * (CUT_KEEP - len("[default0]:")) + CUT_MARK.format(max_line=DEFAULT_MAX_LINE),
    ]
    assert peak < 3 * READ_CHUNK + 2 * DEFAULT_MAX_LINE, f"peak {peak} bytes"
    assert reader.read(final=False) == []  # neither shown again nor re-read
    with log.open("ab") as handle:
        handle.write(b"zz\n[default0]: 10%\r[default0]: 20%\r\n[default0]:\x1b[2Jbye\x00")
    assert [line.text for line in reader.read(final=False)] == [" 10%", " 20%"]
    assert [(line.rank, line.text) for line in reader.read(final=True)] == [
        (0, "\ufffd[2Jbye\ufffd")
    ]


def test_a_rotated_name_with_digits_int_refuses_is_not_a_part(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    for name in ("node-0.log", "node-0.log.1", "node-0.log.\u00b2"):
        (tmp_path / name).write_text("x\n")
    assert log_files.log_parts(log) == [tmp_path / "node-0.log.1", log]
