"""Uploading every staged checkpoint copy to the store (`checkpoint.store`), beside the looks.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer (boto3 for an `s3://` store).

Each staged copy is uploaded to `<prefix>/<job>/<path>@<sha16>` (`checkpoint_files.store_key`),
several at a time, and its manifest entry then names the key. A copy that changed while it
was uploaded, or that is no longer the version staged (a hard link whose file was written in
place since), is not recorded as stored. A failing upload is retried after `UPLOAD_RETRY_S`
and is a problem of the manifest until one succeeds.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

if __package__:
    from orchestrator.node.checkpoint_files import store_key
    from orchestrator.node.checkpoint_stores import (
        FileStore,
        S3Store,
        StoreError,
        open_store,
        parse_store,
    )
else:  # the program on a node: its modules are beside it
    from checkpoint_files import store_key
    from checkpoint_stores import FileStore, S3Store, StoreError, open_store, parse_store

UPLOAD_WORKERS = 4
UPLOAD_RETRY_S = (2.0, 5.0, 15.0, 30.0, 60.0)
GIVE_UP_UPLOADS_S = 300.0  # after the run ended: stop retrying a failing store after this


class Uploads:
    """The uploads of one agent. `state` is the agent: its `lock` guards its `files`
    (path -> manifest entry), `problems` (key -> text) and `dirty` (a new manifest is due),
    which the uploads update as they finish."""

    def __init__(self, state, settings: dict | None, job_id: str, objects: str) -> None:  # noqa: ANN001 - the Agent
        self.state = state
        self.settings = settings
        self.job_id = job_id
        self.objects = objects
        self.store: FileStore | S3Store | None = None
        self.pool = ThreadPoolExecutor(max_workers=UPLOAD_WORKERS)
        self.uploading: set[str] = set()
        self.failures: dict[str, tuple[int, float]] = {}  # path -> (count, retry at)

    def queue(self) -> None:
        """Start the upload of every staged copy not stored yet (and not waiting to retry)."""
        if not self.settings:
            return
        state = self.state
        if self.store is None:
            try:
                self.store = open_store(self.settings)
            except StoreError as exc:
                with state.lock:
                    if state.problems.get("store") != str(exc):
                        state.problems["store"] = str(exc)
                        state.dirty = True
                return
        now = time.time()
        with state.lock:
            for rel, entry in state.files.items():
                staged = entry["staged"]
                if not staged or not staged["object"] or staged["stored"] or rel in self.uploading:
                    continue
                _failures, retry_at = self.failures.get(rel, (0, 0.0))
                if now < retry_at:
                    continue
                self.uploading.add(rel)
                self.pool.submit(self._upload, rel, dict(staged))

    def _upload(self, rel: str, staged: dict) -> None:
        _scheme, _where, prefix = parse_store(self.settings["url"])  # type: ignore[index]
        key = store_key(prefix, self.job_id, rel, staged["digest"])
        path = os.path.join(self.objects, staged["object"])
        error = None
        try:
            before = os.lstat(path)
            if not _as_staged(before, staged):
                error = f"{rel} changed since it was staged"
            else:
                assert self.store is not None
                self.store.upload(path, key)
                if not _as_staged(os.lstat(path), staged):
                    error = f"{rel} changed while it was uploaded"
        except (OSError, StoreError) as exc:
            error = str(exc)
        state = self.state
        with state.lock:
            self.uploading.discard(rel)
            entry = state.files.get(rel)
            current = entry["staged"] if entry else None
            if error is None:
                self.failures.pop(rel, None)
                if current is not None and current["digest"] == staged["digest"]:
                    current["stored"] = key
                if state.problems.pop("store", None) is not None or current is not None:
                    state.dirty = True
                return
            if current is None or current["object"] != staged["object"]:
                return  # that copy was dropped or replaced meanwhile: nothing to retry
            count, _ = self.failures.get(rel, (0, 0.0))
            wait = UPLOAD_RETRY_S[min(count, len(UPLOAD_RETRY_S) - 1)]
            self.failures[rel] = (count + 1, time.time() + wait)
            state.problems["store"] = f"upload failed ({count + 1} in a row): {error}"
            state.dirty = True

    def settled(self, ended_at: float | None) -> bool:
        """Whether no upload is left: all staged copies stored, or the run ended more than
        `GIVE_UP_UPLOADS_S` ago (a failing store is not waited for for ever)."""
        if not self.settings:
            return True
        with self.state.lock:
            if self.uploading:
                return False
            # A file put back from the controller's mirror has no staged object (it was never
            # in the store, and the node holds no copy of its own to send): nothing to wait for.
            waiting = [
                r
                for r, e in self.state.files.items()
                if e["staged"] and e["staged"]["object"] and not e["staged"]["stored"]
            ]
        if not waiting:
            return True
        return ended_at is not None and time.time() - ended_at > GIVE_UP_UPLOADS_S


def _as_staged(info: os.stat_result, staged: dict) -> bool:
    """Whether a staged object still holds the version staged: its size and mtime (a hard
    link's move with every write in place of its file)."""
    return [info.st_size, info.st_mtime_ns] == [staged["size"], staged["mtime_ns"]]
