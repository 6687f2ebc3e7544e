"""The kit every node program shares: whole-file writes, JSON in and out, log lines.

Part of the node runtime (`orchestrator.node.runtime`): standard library only, Python 3.8 or
newer. A file is written whole or not at all: to a new file of a random name in the same
directory (O_EXCL and O_NOFOLLOW: never an existing file or a symlink put there), given its
mode (and owner) through its descriptor, then renamed over the old one. JSON that a node
program reads may come from the job's own code: `read_json` takes anything that is not an
object as nothing, never an error.
"""

import binascii
import contextlib
import json
import os
import sys
import time

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_at(dir_fd, name, text, owner=None, mode=0o644):
    """Replace `name` in the directory `dir_fd` by `text` (str or bytes): written to a new
    file of a random name, given `mode` and `owner` (uid, gid; None: left as made) through
    its descriptor, then renamed over `name` within the same directory."""
    tmp = f".{name}.{binascii.hexlify(os.urandom(8)).decode()}"
    fd = os.open(tmp, _WRITE_FLAGS, mode, dir_fd=dir_fd)
    try:
        data = text.encode() if isinstance(text, str) else text
        while data:
            data = data[os.write(fd, data) :]
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, owner[0], owner[1])
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def write_file(path, text, mode=0o644):
    """Replace the file `path` by `text` whole (`write_at` in its directory)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_at(fd, os.path.basename(path), text, mode=mode)
    finally:
        os.close(fd)


def dumps(document):
    """`document` as one line of compact JSON: what node programs print and store."""
    return json.dumps(document, separators=(",", ":"))


def read_json(text):
    """The JSON object `text` holds; None for anything else (deep nesting included, which
    job code could write to make the parser raise RecursionError)."""
    try:
        value = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def utc(epoch):
    """`epoch` (seconds) as an ISO 8601 UTC time to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def log(message, out=None):
    """One line of a node program's log: its UTC time, then `message`."""
    print(f"{utc(time.time())} {message}", file=out or sys.stdout, flush=True)
