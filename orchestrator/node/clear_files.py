"""Removing a job's own files on a node: what a kept node holds of its last job, or the workdir
files a `--fresh` submit leaves out. Nothing outside the job's folder is ever removed.

The controller runs this program (sent as text on the command line, nothing installed) with
one JSON request as its argument; paths are home-relative unless absolute:

    {"root": "orch-jobs/OWNER",            the job's (or kept cluster's) folder on the node
     "remove": [DIR...],                   folders of orch's own under it, removed whole
     "dir": DIR or null,                   a folder whose named files are removed
     "manifest": FILE or null,             a checkpoint agent's manifest: its files are named
     "paths": [PATH...]}                   more files of `dir`, relative to it

and prints `{"removed": N, "dir": "files" | "whole" | "outside" | "none"}`: how many named
files it removed, and what it made of `dir` (`clear_rule`). A removal that fails is one line
`cannot remove PATH: WHY` on stderr and exit status 1, after everything else was done.

The rules, checked on the node's real paths (symlinks resolved, since only the node sees them):

- A folder of `remove` is removed only when it lies inside `root` (the folder it is in,
  resolved, is `root` or below it); a symlink there is removed, never followed.
- `dir` is cleared file by file only when it resolves to `root` or a folder inside it, and not
  inside a folder of `remove` (that one goes whole). A `dir` that resolves anywhere else (the
  home with `dir: ~`, an absolute path, a symlink leading out) is left as it is: `outside`.
- A named file is removed only when its path is a plain relative one (no empty, `.` or `..`
  part), every folder on the way is a real one (no symlink) and the file a regular file. So
  neither a folder (the workdir itself) nor anything a symlink leads to is ever removed.
  Folders left empty by the removal, below `dir`, are removed too.

Standard library only, Python 3.8 or newer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys

MAX_MANIFEST_BYTES = 64 * 2**20  # a longer manifest is no agent's: refused


def _home(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


def within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (both absolute and normalised)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def clear_rule(real_dir: str, real_root: str, real_removed: list[str]) -> str:
    """What a reset makes of the folder `real_dir`, given the job's folder `real_root` and the
    folders removed whole (all resolved): `whole` when it lies in one of those, `files` when it
    lies in `real_root` (its named files are removed), else `outside` (left as it is)."""
    if any(within(real_dir, removed) for removed in real_removed):
        return "whole"
    if within(real_dir, real_root):
        return "files"
    return "outside"


def plain(rel: object) -> bool:
    """A relative path of plain names: no empty, `.` or `..` part, no NUL."""
    return (
        isinstance(rel, str)
        and "\0" not in rel
        and all(part not in ("", ".", "..") for part in rel.split("/"))
    )


def _reached_file(root: str, rel: str) -> str | None:
    """`root/rel` when every folder on the way is a real one and the end a regular file."""
    path = root
    parts = rel.split("/")
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return None
        if not (stat.S_ISREG(mode) if i == len(parts) - 1 else stat.S_ISDIR(mode)):
            return None
    return path


def _manifest_files(path: str) -> list[str]:
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError:
        return []  # no agent ran, or its folder went: nothing is named
    if len(text) > MAX_MANIFEST_BYTES:
        raise OSError(f"{path} is longer than {MAX_MANIFEST_BYTES} bytes")
    try:
        files = json.loads(text).get("files")
    except (ValueError, AttributeError):
        return []
    return list(files) if isinstance(files, dict) else []


def _remove_files(real_dir: str, names: list[str], failed: list[str]) -> int:
    removed = 0
    emptied: set[str] = set()
    for rel in names:
        if not plain(rel):
            continue
        path = _reached_file(real_dir, rel)
        if path is None:
            continue  # gone already, or not a plain file reached through real folders
        try:
            os.unlink(path)
        except OSError as exc:
            failed.append(f"cannot remove {path}: {exc.strerror or exc}")
            continue
        removed += 1
        parent = os.path.dirname(path)
        while parent != real_dir and within(parent, real_dir):
            emptied.add(parent)
            parent = os.path.dirname(parent)
    for folder in sorted(emptied, key=len, reverse=True):
        with contextlib.suppress(OSError):  # not empty: it stays
            os.rmdir(folder)
    return removed


def _remove_whole(path: str, real_root: str, failed: list[str]) -> None:
    target = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    if target == real_root or not within(target, real_root):
        failed.append(f"cannot remove {path}: it lies outside {real_root}")
        return
    try:
        if os.path.islink(target) or not os.path.isdir(target):
            if os.path.lexists(target):
                os.unlink(target)
        else:
            shutil.rmtree(target)
    except OSError as exc:
        failed.append(f"cannot remove {target}: {exc.strerror or exc}")


def clear(request: dict) -> tuple[dict, list[str]]:
    """Do what `request` asks (see the module docstring); the answer and the failures."""
    failed: list[str] = []
    real_root = os.path.realpath(_home(request["root"]))
    if not os.path.isdir(real_root):
        return {"removed": 0, "dir": "none"}, failed  # a node that never held the job
    remove = [_home(p) for p in request.get("remove") or []]
    real_removed = [
        os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p)) for p in remove
    ]
    removed, made = 0, "none"
    if request.get("dir"):
        real_dir = os.path.realpath(_home(request["dir"]))
        made = clear_rule(real_dir, real_root, real_removed)
        if made == "files" and os.path.isdir(real_dir):
            names = list(request.get("paths") or [])
            if request.get("manifest"):
                try:
                    names += _manifest_files(_home(request["manifest"]))
                except OSError as exc:
                    failed.append(f"cannot read the checkpoint agent's manifest: {exc}")
            removed = _remove_files(real_dir, names, failed)
    for path in remove:
        _remove_whole(path, real_root, failed)
    return {"removed": removed, "dir": made}, failed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: clear_files.py REQUEST_JSON", file=sys.stderr)
        return 2
    answer, failed = clear(json.loads(argv[0]))
    for line in failed:
        print(line, file=sys.stderr)
    print(json.dumps(answer, separators=(",", ":")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
