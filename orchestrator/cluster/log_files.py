"""The mirrored node logs under ORCH_HOME/jobs/<id>/logs: capped in size and rotated.

`node-0.log` is the newest part of node 0's log; once it would pass `logs.max_bytes` it becomes
`node-0.log.1`, the previous `.1` becomes `.2`, and so on up to `logs.keep` rotated files (the
oldest is then deleted). So a job keeps at most about (keep + 1) x max_bytes per node; a single
append larger than the cap (at most one probe's worth, 1 MiB) still goes whole into a fresh file.

Every log also has a count of the bytes rotated out of it, `.rotated/<name>` (all of them,
deleted ones too), so the log reads as one stream whose byte positions never move:
`logical_size` = rotated + current size. The watch resumes from those positions and
`orch logs -f` follows them across rotations (`read_from`).

Node lines carry no time of their own, so each append also records when the controller pulled
those bytes, `.times/<name>`: one `<stream position> <UTC ISO time>` line per append. A line's
time (`time_at`) is the pull that brought its first byte: within one watch interval of when
the node printed it. Records older than the kept files are dropped at each rotation.
"""

from __future__ import annotations

import bisect
from datetime import datetime
from pathlib import Path

from orchestrator.atomic import write_atomic

ROTATED_DIR = ".rotated"
TIMES_DIR = ".times"


def needs_rotation(current_size: int, incoming: int, max_bytes: int) -> bool:
    """Whether a log holding `current_size` bytes is rotated before `incoming` more are
    appended: when it holds something and would pass `max_bytes` (0: never). Pure."""
    return max_bytes > 0 and current_size > 0 and current_size + incoming > max_bytes


def rotation_moves(name: str, keep: int) -> list[tuple[str, str | None]]:
    """The renames of one rotation, in the order they are made: (from, to), to None meaning
    the file is deleted. `keep` rotated files are kept (0: the current one is deleted). Pure."""
    if keep <= 0:
        return [(name, None)]
    moves: list[tuple[str, str | None]] = [(f"{name}.{keep}", None)]
    moves += [(f"{name}.{n}", f"{name}.{n + 1}") for n in range(keep - 1, 0, -1)]
    moves.append((name, f"{name}.1"))
    return moves


def rotated_bytes(path: Path) -> int:
    """Bytes rotated out of the log at `path` so far (0 for a log never rotated)."""
    try:
        return int((path.parent / ROTATED_DIR / path.name).read_text())
    except (OSError, ValueError):
        return 0


def logical_size(path: Path) -> int:
    """The log's length as one stream: bytes rotated out plus the current file's."""
    size = path.stat().st_size if path.exists() else 0
    return rotated_bytes(path) + size


def pull_times(path: Path) -> list[tuple[int, datetime]]:
    """The recorded pulls of the log at `path`: (stream position, UTC time), in order; empty
    for a log mirrored before times were recorded."""
    try:
        text = (path.parent / TIMES_DIR / path.name).read_text()
    except OSError:
        return []
    times = []
    for row in text.splitlines():
        position, _, at = row.partition(" ")
        try:
            times.append((int(position), datetime.fromisoformat(at)))
        except ValueError:
            continue  # a record cut short by a crash
    return times


def time_at(times: list[tuple[int, datetime]], position: int) -> datetime | None:
    """When the byte at stream `position` was pulled, from `pull_times`; None when no pull
    before it was recorded. Pure."""
    index = bisect.bisect_right([p for p, _ in times], position) - 1
    return times[index][1] if index >= 0 else None


def _record_pull(path: Path, position: int, at: datetime) -> None:
    record = path.parent / TIMES_DIR / path.name
    record.parent.mkdir(parents=True, exist_ok=True)
    with record.open("a") as handle:
        handle.write(f"{position} {at.isoformat()}\n")


def _drop_pulls_before(path: Path, position: int) -> None:
    """Forget the pulls of bytes no kept file holds, keeping the one that brought `position`."""
    times = pull_times(path)
    first = max(0, bisect.bisect_right([p for p, _ in times], position) - 1)
    if first == 0:
        return
    record = path.parent / TIMES_DIR / path.name
    write_atomic(record, "".join(f"{p} {at.isoformat()}\n" for p, at in times[first:]))


def _kept_start(path: Path, parts: list[Path]) -> int:
    """The stream position of the first byte the kept files `parts` of `path` hold."""
    return max(0, rotated_bytes(path) - sum(p.stat().st_size for p in parts if p != path))


def rotate(path: Path, keep: int) -> None:
    """Rotate the log at `path` once (see `rotation_moves`) and count the bytes moved out."""
    size = path.stat().st_size if path.exists() else 0
    counter = path.parent / ROTATED_DIR / path.name
    counter.parent.mkdir(parents=True, exist_ok=True)
    moved = str(rotated_bytes(path) + size)
    for source, target in rotation_moves(path.name, keep):
        src = path.parent / source
        if not src.exists():
            continue
        if target is None:
            src.unlink()
        else:
            src.rename(path.parent / target)
    write_atomic(counter, moved)
    _drop_pulls_before(path, _kept_start(path, log_parts(path)))


def append(
    path: Path, data: bytes, *, max_bytes: int, keep: int, pulled_at: datetime | None = None
) -> None:
    """Append `data` to the log at `path`, rotating it first when it would pass the cap;
    `pulled_at` (UTC), when given, is recorded as the time of these bytes (`pull_times`)."""
    size = path.stat().st_size if path.exists() else 0
    if needs_rotation(size, len(data), max_bytes):
        rotate(path, keep)
    if pulled_at is not None and data:
        _record_pull(path, logical_size(path), pulled_at)
    with path.open("ab") as handle:
        handle.write(data)


def log_parts(path: Path) -> list[Path]:
    """The files of the log at `path` that exist, oldest first (`.N` ... `.1`, then the
    current one)."""
    rotated = []
    for candidate in path.parent.glob(f"{path.name}.*"):
        suffix = candidate.name[len(path.name) + 1 :]
        if suffix.isascii() and suffix.isdigit():
            rotated.append((int(suffix), candidate))
    parts = [p for _, p in sorted(rotated, reverse=True)]
    return [*parts, path] if path.exists() else parts


def read_from(path: Path, offset: int, limit: int | None = None) -> tuple[int, bytes]:
    """The log's bytes from stream position `offset` on, as far as the kept files reach, and
    at most `limit` of them (None: all): returns (the position of the first byte returned, the
    bytes). Bytes before the oldest kept file are gone; reading starts at that file then. Only
    the bytes returned are read."""
    parts = log_parts(path)
    position, chunks = _kept_start(path, parts), []
    first = max(offset, position)
    left = -1 if limit is None else limit
    for part in parts:
        end = position + part.stat().st_size
        if end > first and left != 0:
            with part.open("rb") as handle:
                handle.seek(max(0, first - position))
                chunks.append(handle.read(left))
            left = left if left < 0 else left - len(chunks[-1])
        position = end
    return first, b"".join(chunks)
