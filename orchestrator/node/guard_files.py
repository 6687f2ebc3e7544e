"""What the node's guard reads and writes, never through a symlink.

Part of the guard program (`orchestrator.node.guard`), in the node runtime beside it: standard
library only, Python 3.8 or newer. A guard that runs as root reads and writes in folders the
login user (and so the job's code) owns: every part of such a path is opened with
O_NOFOLLOW from a folder the guard trusts, every file it reads must be a regular one (a FIFO
or a device would block or flood it) and is read up to a bound, and every file it writes is
a new one (O_EXCL) given to its owner through its descriptor and renamed into place. Its own
state lives in a folder of its user's, mode 0700.
"""

import contextlib
import errno
import os
import stat

if __package__:
    from orchestrator.node.node_kit import read_json, write_at
else:  # the program on a node: its modules are beside it
    from node_kit import read_json, write_at

__all__ = ["append_at", "open_dir", "own_dir", "read_at", "read_json", "read_terms", "write_at"]

READ_LIMIT = 1 << 20  # bytes the guard reads of any file at most
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_dir(base, parts=(), make=None):
    """A descriptor of the directory `base`/`parts`..., opened one part at a time, never
    through a symlink (`base` itself is trusted: the home passwd or the terms name). With
    `make` = (mode, owner) a missing part is made and, where it is not `owner`'s, given to
    it through its descriptor (owner None: left as made); without, it raises OSError."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if make is None:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, make[0], dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
                st = os.fstat(child)
                if make[1] is not None and (st.st_uid, st.st_gid) != tuple(make[1]):
                    os.fchown(child, make[1][0], make[1][1])
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at(dir_fd, name):
    """The text of the regular file `name` in `dir_fd` (at most READ_LIMIT bytes), opened
    without following a symlink or waiting on a FIFO; None when missing or not a file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size < READ_LIMIT:
            chunk = os.read(fd, READ_LIMIT - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def append_at(dir_fd, name, text, whole, owner=None, limit=READ_LIMIT):
    """Append `text` to the file `name` in `dir_fd`, opened without following a symlink or
    waiting on a FIFO, when it is a regular file of one link, `owner`'s (None: the guard's
    user's), with room for `text` within `limit` bytes. Anything else there (missing, a link,
    a FIFO, another user's, full) is replaced by `whole`, written as `write_at` writes."""
    data = text.encode()
    uid = os.geteuid() if owner is None else owner[0]
    try:
        fd = os.open(name, APPEND_FLAGS, dir_fd=dir_fd)
    except OSError:
        fd = None
    if fd is not None:
        try:
            st = os.fstat(fd)
            fits = st.st_size + len(data) <= limit
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == uid and fits:
                while data:
                    data = data[os.write(fd, data) :]
                return
        finally:
            os.close(fd)
    write_at(dir_fd, name, whole, owner=owner)


def own_dir(path):
    """A descriptor of the guard's own state directory `path`, made 0700 when missing; one
    that is a symlink, or not the guard's user's, is refused (OSError)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    fd = os.open(path, DIR_FLAGS)
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise OSError(errno.EPERM, f"{path} belongs to another user")
    os.fchmod(fd, 0o700)
    return fd


def read_terms(path):
    """The terms document at `path` (its directory is the guard's: root's on AWS)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), DIR_FLAGS)
    except OSError:
        return None
    try:
        return read_json(read_at(fd, os.path.basename(path)))
    finally:
        os.close(fd)
