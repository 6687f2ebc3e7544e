"""Putting checkpoint files back on a node from the store, before a run starts.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer. The controller sends the plan (which files, from
which keys, with which sizes and digests); every file is downloaded beside the checkpoint
directory, its digest checked, and only then moved into place. A file the node already holds
as recorded stays as it is.
"""

from __future__ import annotations

import io
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

if __package__:
    from orchestrator.node.checkpoint_files import canonical, file_digest, home_path
    from orchestrator.node.checkpoint_stores import StoreError, open_store
else:  # the program on a node: its modules are beside it
    from checkpoint_files import canonical, file_digest, home_path
    from checkpoint_stores import StoreError, open_store

RESTORE_WORKERS = 8


def _safe_destination(root: str, rel: str) -> str:
    """`root/rel`, its directories made; refuses a path through a symlink."""
    if not canonical(rel):
        raise StoreError(f"refusing to restore {rel!r}")
    path = root
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise StoreError(f"refusing to restore {rel!r}: {path} is a symlink")
        os.makedirs(path, exist_ok=True)
    return os.path.join(path, rel.split("/")[-1])


def held_already(root: str, item: dict) -> bool:
    """Whether the checkpoint directory holds `item` as recorded (size, then digest): a node
    that stayed through a recovery keeps its files, which need no download."""
    path = root
    try:
        for part in item["path"].split("/"):
            path = os.path.join(path, part)
            if os.path.islink(path):
                return False  # the download refuses such a path; so does this
        if os.path.getsize(path) != int(item["size"]):
            return False
        return file_digest(path) == item["digest"]
    except OSError:
        return False


def restore(plan: dict, out: io.TextIOBase) -> int:
    """Download `plan["files"]` from the store into the checkpoint directory; 0 when every one
    arrived with its digest. A file the directory already holds with the recorded size and
    digest stays as it is. Prints `progress DONE TOTAL` lines and `restored N BYTES S`."""
    root = home_path(plan["checkpoint_dir"])
    files = plan["files"]
    total = sum(int(f["size"]) for f in files)
    started = time.monotonic()
    try:
        store = open_store(plan["store"])
    except StoreError as exc:
        print(f"error {exc}", file=out, flush=True)
        return 1
    staging = os.path.join(root, ".tmp-orch-restore")
    os.makedirs(staging, exist_ok=True)
    done = [0]
    lock = threading.Lock()

    def fetch(index: int, item: dict) -> None:
        if not canonical(item["path"]) or not held_already(root, item):
            download(index, item)
        with lock:
            done[0] += int(item["size"])
            print(f"progress {done[0]} {total}", file=out, flush=True)

    def download(index: int, item: dict) -> None:
        tmp = os.path.join(staging, str(index))
        if store.download(item["key"], tmp) != item["digest"]:
            raise StoreError(f"{item['key']}: its digest is not the one recorded")
        os.replace(tmp, _safe_destination(root, item["path"]))

    try:
        with ThreadPoolExecutor(max_workers=RESTORE_WORKERS) as pool:
            for future in [pool.submit(fetch, i, f) for i, f in enumerate(files)]:
                future.result()
    except (OSError, StoreError) as exc:
        print(f"error {exc}", file=out, flush=True)
        return 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"restored {len(files)} {total} {time.monotonic() - started:.2f}", file=out, flush=True)
    return 0
