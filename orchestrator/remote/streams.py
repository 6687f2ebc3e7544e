"""Line streams: a command left running on a node, each line it prints handed over as it comes.

`CommandLines` is what `NodeConnection.stream(command)` returns: an iterator over the decoded
lines of one command on a channel of the node's open connection (no new SSH handshake), which
`close()` ends from any thread. `LineStream` builds on it: it keeps a command running from a
thread of its own, starting it again after `retry_s` when it ends or its channel drops, and
hands every line to a callback. Nothing here decides what a line means.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import paramiko

from orchestrator.errors import NodeUnreachable, OrchError, StreamStalled
from orchestrator.remote.lines import DEFAULT_MAX_LINE, LineSplitter

if TYPE_CHECKING:
    from orchestrator.remote.ssh import NodeConnection

_POLL_S = 0.25  # how often a reader wakes to see whether it must stop


class CommandLines:
    """The lines one command prints on its node, as it prints them. Iterate once; `close()`.

    Contract of the iteration (from one thread), that of `remote.lines.LineSplitter`:
    - each line is its bytes up to a newline, without it, as `lines.printable` text (UTF-8;
      undecodable bytes and control characters but tab replaced by U+FFFD; a trailing carriage
      return dropped); a last line without a newline is handed over when the command ends;
    - a line longer than `max_line` bytes (64 KiB by default) is handed over as its first 200
      bytes and a marker (`lines.CUT_MARK`) as soon as it is known to be too long; the rest of
      it, up to its newline, is dropped (however the bytes arrived: in one read or many). So a
      stream holds at most `max_line` bytes of a line whatever the node prints, and reads in
      time linear in the bytes;
    - iteration ends when the command's output ends (it exited, or the node closed the
      channel; `exit_status()` then tells how) or once `close()` was called, from any thread;
    - `StreamStalled` when the command printed nothing for `idle_timeout_s` (if set), and
      `NodeUnreachable` when the channel or the connection breaks: never a paramiko error.
      The stream is closed when either is raised.

    Closing the channel ends the command on the node (with a pseudo-terminal it is hung up even
    when stuck). The stream is a context manager that closes it on exit. Thread-safe `close()`,
    idempotent.
    """

    def __init__(
        self,
        channel: paramiko.Channel,
        *,
        name: str,
        idle_timeout_s: float | None = None,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        self.name = name
        self.idle_timeout_s = idle_timeout_s
        self.max_line = max_line
        self._channel = channel
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        """True once `close()` was called (or the stream closed itself on an error)."""
        return self._closed.is_set()

    def close(self) -> None:
        """Close the channel, which ends the command; iteration stops at its next wake-up."""
        self._closed.set()
        self._channel.close()

    def exit_status(self, wait_s: float = 2.0) -> int | None:
        """The command's exit status, waiting at most `wait_s` for it to arrive; None when it
        did not (the channel dropped, or the command still runs). -1: the node gave none."""
        if not self._channel.status_event.wait(wait_s):
            return None
        return self._channel.exit_status

    def _connection_lost(self) -> bool:
        """At the end of the output: whether it ended because the connection went down (no
        exit status came, and the transport is down), not because the command ended."""
        channel = self._channel
        if not channel.status_event.wait(2.0) or channel.exit_status != -1:
            return False
        transport = channel.get_transport()
        # The transport closes its channels just before it marks itself inactive.
        deadline = time.monotonic() + 0.5
        while transport is not None and transport.is_active():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def __enter__(self) -> CommandLines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[str]:
        channel = self._channel
        try:
            channel.settimeout(_POLL_S)
        except OSError:  # a channel closed already
            return
        splitter = LineSplitter(self.max_line)
        last_output = time.monotonic()
        while not self._closed.is_set():
            try:
                data = channel.recv(65536)
            except TimeoutError:
                silent_s = time.monotonic() - last_output
                if self.idle_timeout_s is not None and silent_s > self.idle_timeout_s:
                    self.close()
                    raise StreamStalled(
                        f"{self.name}: printed nothing for {self.idle_timeout_s:.0f} s",
                        hint="the command may be hung, or the node cut off",
                    ) from None
                continue
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if self._closed.is_set():
                    return
                self.close()
                raise NodeUnreachable(
                    f"{self.name}: lost the command's channel: {exc}",
                    hint="the node may be gone or cut off",
                ) from exc
            if not data:
                if not self._closed.is_set() and self._connection_lost():
                    self.close()
                    raise NodeUnreachable(
                        f"{self.name}: the connection went down while the command ran",
                        hint="the node may be gone or cut off",
                    )
                break
            last_output = time.monotonic()
            for line in splitter.feed(data):
                yield line.text
                if self._closed.is_set():
                    return
        if not self._closed.is_set():
            for line in splitter.flush():
                yield line.text


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
        self._lines: CommandLines | None = None
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
            lines = self._lines
        if lines is not None:
            lines.close()
        if self._thread is not None and wait_s > 0:
            self._thread.join(wait_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._pump()
            except OrchError as exc:
                self.status = f"retrying: {exc}"
            if self._stop.wait(self.retry_s):
                return

    def _pump(self) -> None:
        lines = self.connection.stream(self.command)
        with self._lock:
            self._lines = lines
        try:
            if self._stop.is_set():
                return
            self.status = "running"
            for text in lines:
                self.on_line(text)
            if not self._stop.is_set():
                self.status = "retrying: the command ended"
        finally:
            with self._lock:
                self._lines = None
            lines.close()
