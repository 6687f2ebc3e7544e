"""Replacing a file whole or not at all: the one way the controller side writes a file that
another process (or the next run of this one) reads.

`write_atomic(path, data)` writes `data` to a new temporary file in `path`'s folder, flushes
it to disk, renames it onto `path` and flushes the folder: a reader sees the old content or the
new one, never a part, and a process killed at any line leaves the old file whole (and at worst a
`.<name>.<random>.tmp` beside it). The standard library only; imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

PRIVATE_MODE = 0o600
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def temporary_name(path: Path) -> Path:
    """A fresh name beside `path` for its next content (hidden, unique, ends in `.tmp`)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def write_atomic(
    path: Path,
    data: bytes | str,
    *,
    private: bool = False,
    times_ns: tuple[int, int] | None = None,
) -> None:
    """Replace `path` with `data` (str is written as UTF-8), whole or not at all.

    The file is 0600 when `private`, else the mode a new file gets under the umask. `times_ns`
    (atime, mtime), when given, is the new file's times. The temporary file is created anew
    (never through a link) and removed when the write fails; the folder must exist. Raises
    OSError as the writes do.
    """
    content = data.encode() if isinstance(data, str) else data
    tmp = temporary_name(path)
    fd = os.open(tmp, _FLAGS, PRIVATE_MODE if private else 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            if private:
                os.fchmod(handle.fileno(), PRIVATE_MODE)  # whatever the umask allowed
            handle.write(content)
            handle.flush()
            if times_ns is not None:
                os.utime(handle.fileno(), ns=times_ns)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Flush `folder`'s entries (a rename into it) to disk; best effort where a filesystem
    cannot sync a folder."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def install(built: Path, path: Path) -> None:
    """Put the finished file `built` (in `path`'s folder, written by someone else: a database
    built aside) in place of `path`, flushed to disk first, as `write_atomic` does."""
    fd = os.open(built, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(built, path)
    sync_folder(path.parent)
