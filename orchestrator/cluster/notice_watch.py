"""Watch every node of a cluster for spot interruption notices, over SSH.

One long-lived poller per node (see `spot_notice`), streamed over the node's existing SSH
connection (`NodeConnection.stream`); a notice reaches the controller as soon as the node sees
it (the poller's own interval, 5 s by default, bounds the delay). Nothing here decides what to
do about a notice: `on_notice(rank, notice)` is called once per node and notice, from the
watcher's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.node_runtime import ensure_runtime
from orchestrator.errors import OrchError
from orchestrator.node.spot_notice import SpotNotice, parse_poller_line, poller_command
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.streams import CommandLines

_RETRY_S = 5.0  # pause before the poller is started again after it stopped


class NoticeWatcher:
    """Spot notices of every node of `cluster`. Build (no I/O) -> `start()` -> `stop()`.

    Contract: `on_notice` is called at most once per node, at the first notice it posts.
    `status` says per node what is known: "starting", "watching" (the endpoint answered),
    "unavailable: <why>" (the node has no metadata endpoint; node loss is then caught by the
    provider and by missed probes instead), or "retrying: <why>". Never raises for a node's
    failure: a dropped channel is retried while the watcher runs.
    """

    def __init__(
        self,
        cluster: Cluster,
        on_notice: Callable[[int, SpotNotice], None],
        *,
        interval_s: float = 5.0,
    ) -> None:
        self.cluster = cluster
        self.on_notice = on_notice
        self.commands = [
            poller_command(instance.metadata_url, interval_s) for instance in cluster.instances
        ]
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
        """Close every poller's stream (which ends the poller) and join the threads."""
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
                finished = self._run_poller(rank, connection)
            except OrchError as exc:
                self.status[rank] = f"retrying: {exc}"
                finished = False
            if finished or self._stop.wait(_RETRY_S):
                return

    def _run_poller(self, rank: int, connection: NodeConnection) -> bool:
        """Run the poller until it exits; True when it said the node has no endpoint."""
        ensure_runtime(connection)
        lines = connection.stream(self.commands[rank])
        with self._lock:
            self._streams[rank] = lines
        try:
            if self._stop.is_set():
                return False
            for text in lines:
                if self._line(rank, text):
                    return True
            if not self._stop.is_set():
                self.status[rank] = "retrying: the poller's channel closed"
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
    """Wait until every node's poller is watching (or has no endpoint); True if they all are."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(s == "watching" or s.startswith("unavailable") for s in watcher.status):
            return True
        time.sleep(0.1)
    return False
