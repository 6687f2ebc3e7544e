"""Line streams: a command left running on a node, each line it prints handed over as it comes.

A `LineStream` runs its command on a channel of the node's open connection (no new SSH
handshake) from a thread of its own. When the command ends or the channel drops while the
stream runs, it is started again after `retry_s`; `stop()` closes the channel, which ends the
command, and joins the thread. Nothing here decides what a line means.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import paramiko

from orchestrator.errors import OrchError
from orchestrator.remote.ssh import NodeConnection

_POLL_S = 0.25  # how often the reader wakes to see whether it must stop


class LineStream:
    """`on_line(text)` for every line `command` prints on the node, from the stream's thread.

    `status` says what is known: "starting", "running", or "retrying: <why>". Never raises for
    the node's failures; `on_line` must not raise either."""

    def __init__(
        self,
        connection: NodeConnection,
        command: str,
        on_line: Callable[[str], None],
        *,
        name: str,
        retry_s: float = 5.0,
    ) -> None:
        self.connection = connection
        self.command = command
        self.on_line = on_line
        self.name = name
        self.retry_s = retry_s
        self.status = "starting"
        self._stop = threading.Event()
        self._channel: paramiko.Channel | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 1.0) -> None:
        """End the command (its channel is closed) and wait at most `wait_s` for the thread:
        one stuck connecting to a node that went away ends by itself once it gives up."""
        self._stop.set()
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.close()
        if self._thread is not None and wait_s > 0:
            self._thread.join(wait_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._pump()
            except (OrchError, paramiko.SSHException, OSError, EOFError) as exc:
                self.status = f"retrying: {exc}"
            if self._stop.wait(self.retry_s):
                return

    def _pump(self) -> None:
        channel = self.connection.transport.open_session(timeout=10.0)
        with self._lock:
            self._channel = channel
        try:
            channel.exec_command(self.command)
            channel.settimeout(_POLL_S)
            self.status = "running"
            pending = b""
            while not self._stop.is_set():
                try:
                    data = channel.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    self.status = "retrying: the command ended"
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self.on_line(raw.decode("utf-8", errors="replace"))
        finally:
            with self._lock:
                self._channel = None
            channel.close()
