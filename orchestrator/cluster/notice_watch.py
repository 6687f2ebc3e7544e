"""Watch every node of a cluster for spot interruption notices, over SSH.

Each node's guard polls its metadata endpoint as one of its events and appends what it learns
to the node's notice file (see `spot_notice`); this follows that file on every node over the
node's existing SSH connection (`NodeConnection.stream`, `tail -F`), so a notice reaches the
controller as soon as the guard writes it (the guard's poll period, 5 s by default, bounds the
delay). Nothing here decides what to do about a notice: `on_notice(rank, notice)` is called
once per node and notice, from the watcher's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.cluster.connections import Cluster
from orchestrator.errors import OrchError
from orchestrator.node.spot_notice import SpotNotice, follow_command, parse_poller_line
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.streams import CommandLines

_RETRY_S = 5.0  # pause before the notice file is followed again after the channel closed


class NoticeWatcher:
    """Spot notices of every node of `cluster`. Build (no I/O) -> `start()` -> `stop()`.

    Contract: `on_notice` is called at most once per node, at the first notice it posts.
    `status` says per node what is known: "starting" (the guard has not said `ready` yet),
    "watching" (the endpoint answered), "unavailable: <why>" (the node has no metadata
    endpoint; node loss is then caught by the provider and by missed probes instead), or
    "retrying: <why>". Never raises for a node's failure: a dropped channel is retried while
    the watcher runs.
    """

    def __init__(self, cluster: Cluster, on_notice: Callable[[int, SpotNotice], None]) -> None:
        self.cluster = cluster
        self.on_notice = on_notice
        self.command = follow_command()
        self.status = ["starting"] * len(cluster.instances)
        self._noticed = [False] * len(cluster.instances)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._streams: dict[int, CommandLines] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for rank, connection in enumerate(self.cluster.connections):
            thread = threading.Thread(
                target=self._watch, args=(rank, connection), name=f"notice-watch {rank}",
                daemon=True,
            )  # fmt: skip
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Close every node's stream (which ends its `tail`) and join the threads."""
        self._stop.set()
        with self._lock:
            streams = list(self._streams.values())
        for lines in streams:
            lines.close()
        for thread in self._threads:
            thread.join(5.0)

    def _watch(self, rank: int, connection: NodeConnection) -> None:
        while not self._stop.is_set():
            try:
                finished = self._follow(rank, connection)
            except OrchError as exc:
                self.status[rank] = f"retrying: {exc}"
                finished = False
            if finished or self._stop.wait(_RETRY_S):
                return

    def _follow(self, rank: int, connection: NodeConnection) -> bool:
        """Follow the node's notice file until the channel closes; True when it said the node
        has no endpoint."""
        lines = connection.stream(self.command)
        with self._lock:
            self._streams[rank] = lines
        try:
            if self._stop.is_set():
                return False
            for text in lines:
                if self._line(rank, text):
                    return True
            if not self._stop.is_set():
                self.status[rank] = "retrying: the notice file's channel closed"
            return False
        finally:
            with self._lock:
                self._streams.pop(rank, None)
            lines.close()

    def _line(self, rank: int, text: str) -> bool:
        line = parse_poller_line(text)
        if line.kind == "ready":
            self.status[rank] = "watching"
        elif line.kind == "unavailable":
            self.status[rank] = f"unavailable: {line.detail}"
            return True
        elif line.kind == "notice" and line.notice is not None and not self._noticed[rank]:
            self._noticed[rank] = True
            self.on_notice(rank, line.notice)
        return False


def wait_watching(watcher: NoticeWatcher, timeout_s: float) -> bool:
    """Wait until every node's guard is watching (or has no endpoint); True if they all are."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(s == "watching" or s.startswith("unavailable") for s in watcher.status):
            return True
        time.sleep(0.1)
    return False
