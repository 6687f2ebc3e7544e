"""Staging one version of a checkpoint file: a copy that is never torn.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer.

`stage` takes the cheapest copy the file and the filesystem allow: a hard link (for a file that
is never written again in place), a reflink (btrfs, xfs: the blocks are shared until either
side is written), else a byte copy, hashed as it is made. The copy is kept only if the file did
not change while it was copied (the same inode, size, mtime and ctime before and after, and
under its name) and the copy is whole (`checkpoint_whole.whole`); it is written beside the
staged copies and renamed into place, so the previous copy of the file stays until this one
is complete.
"""

from __future__ import annotations

import contextlib
import os
import stat

if __package__:
    from orchestrator.node.checkpoint_files import hash_fd, identity, object_name
    from orchestrator.node.checkpoint_whole import OPEN_FLAGS, whole
else:  # the program on a node: its modules are beside it
    from checkpoint_files import hash_fd, identity, object_name
    from checkpoint_whole import OPEN_FLAGS, whole

FICLONE = 0x40049409  # ioctl: share the blocks of another file (btrfs, xfs); else a copy
CHANGED = "changed while it was copied"
NOT_WHOLE = "not whole (a write cut short)"


def stage(src: str, rel: str, objects_dir: str, *, link: bool, tag: str) -> dict | str:
    """Stage one file into `objects_dir`; the staged entry, or why it was not taken.

    With `link`, a hard link (for a file never written again in place: a directory
    checkpoint's, or one whose versions are renamed into place); otherwise a copy, a reflink
    where the filesystem can. Either way the content is hashed, and the result is kept only if
    the file did not change meanwhile and the copy is whole. Why it was not taken starts with
    `CHANGED` or `NOT_WHOLE` for a file being written."""
    tmp = os.path.join(objects_dir, f".tmp-{tag}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        fd = os.open(src, OPEN_FLAGS)
    except OSError as exc:
        return f"cannot open: {exc.strerror}"
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return "not a regular file"
        linked = False
        if link:
            try:
                os.link(src, tmp, follow_symlinks=False)
                linked = os.lstat(tmp).st_ino == before.st_ino
            except OSError:
                linked = False
            if linked:
                before = os.fstat(fd)  # the new link moved the ctime
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

        def unchanged() -> bool:  # a save that began during the copy ends it at once
            return identity(os.fstat(fd)) == identity(before)

        if linked:
            digest = hash_fd(fd, None, unchanged=unchanged)
        else:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                cloned = False
                with contextlib.suppress(OSError, ImportError):
                    import fcntl

                    fcntl.ioctl(out, FICLONE, fd)
                    cloned = True
                digest = hash_fd(fd, None if cloned else out, unchanged=unchanged)
                # The copy looks like the file: its permissions and mtime travel with it.
                os.fchmod(out, stat.S_IMODE(before.st_mode))
                os.utime(out, ns=(before.st_atime_ns, before.st_mtime_ns))
            finally:
                os.close(out)
        after = os.fstat(fd)
        try:
            named = os.lstat(src)
        except OSError:
            named = None
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return f"staging failed: {exc.strerror or exc}"
    finally:
        os.close(fd)
    same = named is not None and identity(before) == identity(after) == identity(named)
    if digest is None or not same:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return CHANGED
    if whole(tmp, rel.rsplit("/", 1)[-1]) is False:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return NOT_WHOLE
    name = object_name(rel, digest)
    final = os.path.join(objects_dir, name)
    os.replace(tmp, final)
    ctime_ns = before.st_ctime_ns
    if linked:  # the rename moved the shared inode's ctime once more
        placed = os.lstat(final)
        if [placed.st_size, placed.st_mtime_ns] != [before.st_size, before.st_mtime_ns]:
            with contextlib.suppress(OSError):
                os.unlink(final)
            return CHANGED
        ctime_ns = placed.st_ctime_ns
    return {
        "digest": digest,
        "size": before.st_size,
        "mtime_ns": before.st_mtime_ns,
        "ctime_ns": ctime_ns,
        "object": name,
        "linked": linked,
        "stored": None,
        "restored": False,
    }
