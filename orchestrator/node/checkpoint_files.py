"""What the checkpoint agent takes for a checkpoint file, and how it finds them.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer. The controller uses the same rules (names it
refuses, paths it accepts, the store's keys), so a node and its controller never disagree on
what a checkpoint file is called.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable

COMPLETE_MARKER = "COMPLETE"
DCP_METADATA = ".metadata"
STEP_DIR = re.compile(r"^step-\d+$")
DCP_SHARD = re.compile(r"^__\d+_\d+\.distcp$")
SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1: NUL, newlines, terminal escapes
MAX_NAME_BYTES = 255  # one part of a path (NAME_MAX)
MAX_PATH_BYTES = 2048  # a path under the checkpoint directory (the mirror's folder adds its own)


def refused_name(rel: str) -> str | None:
    """Why orch takes no file by this name (here and on the controller alike), or None: the
    name holds a control character (NUL, a newline, a terminal escape), or is longer than
    every file system takes."""
    if CONTROL.search(rel):
        return "its name holds control characters"
    parts = [part.encode("utf-8", "surrogateescape") for part in rel.split("/")]
    if sum(len(part) + 1 for part in parts) > MAX_PATH_BYTES + 1 or any(
        len(part) > MAX_NAME_BYTES for part in parts
    ):
        return "its name is too long"
    return None


def shown(text: str, limit: int = 160) -> str:
    """`text` safe to print: control characters as `\\xNN`, at most `limit` characters."""
    escaped = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def canonical(rel: str) -> bool:
    """A relative path with no empty, `.` or `..` part (so not absolute either)."""
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def skipped(rel: str) -> bool:
    """Whether a path under the checkpoint directory is never staged: not canonical or not
    UTF-8, a name orch refuses (`refused_name`), a temporary, or build and tool output that is
    no checkpoint."""
    if not canonical(rel) or refused_name(rel) is not None:
        return True
    parts = rel.split("/")
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the node: no name to ask for it by
        return True
    if any(part.startswith(".tmp") for part in parts):
        return True
    if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts[:-1]):
        return True
    return parts[-1].endswith((".tmp", ".pyc"))


def written_once(rel: str, marked_dirs: set[str]) -> bool:
    """Whether a file belongs to a directory checkpoint (written once: staged as a link)."""
    parts = rel.split("/")
    parent = "/".join(parts[:-1])
    return (
        (len(parts) > 1 and STEP_DIR.match(parts[0]) is not None)
        or DCP_SHARD.match(parts[-1]) is not None
        or parts[-1] == DCP_METADATA
        or parent in marked_dirs
    )


def scan(
    root: str, exclude: set[str], refused: dict[str, str] | None = None
) -> dict[str, os.stat_result]:
    """Every regular file under `root` that may be a checkpoint, by '/'-separated relative
    path; symlinks are neither followed nor returned, `exclude` (absolute paths) is skipped.
    Names orch refuses go to `refused` (name -> why) instead.

    `root` and `exclude` are compared as real paths: a root given as `$HOME/.` (`dir: ~`), with
    a `..` or through a symlink still leaves out every excluded folder below it."""
    found: dict[str, os.stat_result] = {}
    root = os.path.realpath(root)
    if not os.path.isdir(root):
        return found
    exclude = {os.path.realpath(path) for path in exclude}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [
            d
            for d in dirnames
            if not (d in SKIPPED_DIRS or d.startswith(".tmp") or d.endswith(".egg-info"))
            and os.path.join(dirpath, d) not in exclude
        ]
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            why = refused_name(rel)
            if why is not None and refused is not None:
                refused[rel] = why
            if skipped(rel):
                continue
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[rel] = info
    return found


def version_of(info: os.stat_result) -> list[int]:
    """What identifies one version of a file's content: size and mtime (ns)."""
    return [info.st_size, info.st_mtime_ns]


def identity(info: os.stat_result) -> tuple[int, ...]:
    """What must not move while a file is copied: any write changes mtime or ctime."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def object_name(rel: str, digest: str) -> str:
    """The staged copy's file name: one per path and content, hex only."""
    return hashlib.sha256(f"{rel}\0{digest}".encode()).hexdigest()


def store_key(prefix: str, job_id: str, rel: str, digest: str) -> str:
    """Where a file's version lives in the store: the path, then its content's first 16 hex."""
    base = "/".join(p for p in (prefix.strip("/"), job_id) if p)
    return f"{base}/{rel}@{digest[:16]}"


def home_path(path: str) -> str:
    """`path` as given when absolute, else under the home directory."""
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


CHUNK = 4 * 1024 * 1024


def new_digest() -> hashlib._Hash:  # type: ignore[name-defined]
    """The content digest of checkpoint files: BLAKE2b-256 (`b2sum -l 256` prints it). It runs
    at about twice SHA-256's speed on CPUs without SHA instructions, the Cascade Lake nodes of
    many GPU instance types among them, and every staged and restored byte is hashed."""
    return hashlib.blake2b(digest_size=32)


def hash_fd(fd: int, out: int | None, *, unchanged: Callable[[], bool] | None = None) -> str | None:
    """The digest (`new_digest`) of what `fd` holds from its start, also written to `out`;
    None as soon as `unchanged()`, asked after each chunk, says the file changed meanwhile."""
    digest = new_digest()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        count = os.readv(fd, [buffer])
        if not count:
            return digest.hexdigest()
        if unchanged is not None and not unchanged():
            return None
        digest.update(view[:count])
        if out is not None:
            written = 0
            while written < count:
                written += os.write(out, view[written:count])


def file_digest(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return hash_fd(fd, None)  # type: ignore[return-value]  # None only with `unchanged`
    finally:
        os.close(fd)
