"""Setting checkpoints aside on a node before a restart: list the checkpoint directory, and move
named entries out of it into orch's own folder of the job, where no script looks.

The controller runs this program (the node runtime's `set-aside`, `orchestrator.node.runtime`) on
every node of a restarted run, after the resume checkpoint was put back and before the run
starts: first `list`, then, for what its rule (`orchestrator.cluster.checkpoints.resume_point`)
says must go, `move`. Both read their request as JSON on stdin and print one JSON document.

    list  {"checkpoint_dir": DIR, "exclude": [DIR...], "limit": N}
          -> {"files": {PATH: SIZE}, "more": BOOL}
    move  {"checkpoint_dir": DIR, "entries": [PATH...], "to": DIR, "tag": TAG}
          -> {"folder": TAG[-K], "moved": [PATH...], "failed": [[PATH, WHY]...]}

Paths are relative to the checkpoint directory; directories are home-relative unless absolute.
`list` gives every regular file (symlinks are neither followed nor listed; temporaries,
`__pycache__`, `.git` and `exclude` are left out), at most `limit` of them (`more` says there
were others). `move` renames each entry (a file or a directory, reached through real
directories only, never through a symlink) to `TO/TAG/PATH`, keeping its relative path; where
`TO` is on another filesystem, it is copied there, then removed. Nothing is ever deleted that
was not first copied whole. `TAG` gets a `-K` suffix when a folder of that name exists.

Stdlib only, Python 3.8 or newer; it never imports torch.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import sys

SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
_TAG = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")


def _home_path(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


def _left_out(name: str, is_dir: bool) -> bool:
    """Names that are no checkpoint: temporaries and tool output (as the checkpoint agent)."""
    if name.startswith(".tmp") or (is_dir and name.endswith(".egg-info")):
        return True
    if is_dir:
        return name in SKIPPED_DIRS
    return name.endswith((".tmp", ".pyc"))


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the node: no name to ask for it by
        return False
    return True


def list_files(request: dict) -> dict:
    """The `list` command (see the module docstring)."""
    root = os.path.abspath(_home_path(request["checkpoint_dir"]))
    exclude = {os.path.abspath(_home_path(p)) for p in request.get("exclude", [])}
    limit = int(request.get("limit", 100000))
    files: dict[str, int] = {}
    more = False
    if not os.path.isdir(root) or os.path.islink(root):
        return {"files": files, "more": more}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not _left_out(d, True)
            and _utf8(d)
            and os.path.join(dirpath, d) not in exclude
            and not os.path.islink(os.path.join(dirpath, d))
        )
        for name in sorted(filenames):
            if _left_out(name, False) or not _utf8(name):
                continue
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if len(files) >= limit:
                more = True
                break
            files[f"{rel_dir}/{name}" if rel_dir else name] = info.st_size
        if more:
            break
    return {"files": files, "more": more}


def _reached(root: str, rel: str) -> str | None:
    """`root/rel` when every part of `rel` is a plain name, every directory on the way a real
    one (no symlink) and the entry itself a regular file or a real directory; else None."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    path = root
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return None
        last = i == len(parts) - 1
        if not (stat.S_ISDIR(mode) or (last and stat.S_ISREG(mode))):
            return None
    return path


def _folder(to: str, tag: str) -> tuple[str, str]:
    """A new folder `to/tag` (or `to/tag-K`); its name and path."""
    os.makedirs(to, mode=0o700, exist_ok=True)
    for k in range(1000):
        name = tag if k == 0 else f"{tag}-{k}"
        path = os.path.join(to, name)
        try:
            os.mkdir(path, 0o700)
            return name, path
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"no free folder name for {tag}")


def _move(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    try:
        os.rename(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    try:  # another filesystem: a whole copy first, then the original goes
        if os.path.isdir(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
    except OSError:
        if os.path.isdir(target):
            shutil.rmtree(target, ignore_errors=True)
        elif os.path.lexists(target):
            os.unlink(target)
        raise
    if os.path.isdir(source):
        shutil.rmtree(source)
    else:
        os.unlink(source)


def move_entries(request: dict) -> dict:
    """The `move` command (see the module docstring)."""
    root = os.path.abspath(_home_path(request["checkpoint_dir"]))
    tag = str(request["tag"])
    if not _TAG.match(tag):
        return {"folder": None, "moved": [], "failed": [["", f"bad tag {tag!r}"]]}
    to = os.path.abspath(_home_path(request["to"]))
    real_root = os.path.realpath(root)
    if to == real_root or to.startswith(real_root.rstrip("/") + "/"):
        why = "the folder for set-aside checkpoints lies inside the checkpoint directory"
        return {"folder": None, "moved": [], "failed": [["", why]]}
    name, folder = _folder(to, tag)
    moved: list[str] = []
    failed: list[list[str]] = []
    for rel in request["entries"]:
        source = _reached(root, rel) if isinstance(rel, str) else None
        if source is None:
            failed.append([str(rel), "not there, or reached through a symlink"])
            continue
        try:
            _move(source, os.path.join(folder, *rel.split("/")))
        except OSError as exc:
            failed.append([rel, exc.strerror or str(exc)])
            continue
        moved.append(rel)
    return {"folder": name, "moved": moved, "failed": failed}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("list", "move"):
        print("usage: set_aside.py list|move < request.json", file=sys.stderr)
        return 2
    request = json.load(sys.stdin)
    answer = list_files(request) if argv[0] == "list" else move_entries(request)
    print(json.dumps(answer, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
