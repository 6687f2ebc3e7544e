"""`remote.ssh._exec` against a channel whose last output and EOF arrive together, between its
look for data and its look for the EOF (as a loaded machine's transport thread delivers them):
the output is read whole, never lost to the EOF."""

from __future__ import annotations

import threading
from typing import Any

from orchestrator.remote import ssh


class LateOutputChannel:
    """A finished command whose output `b"29500\\n"` lands with the EOF right after the first
    `recv_ready()` answered no: data and EOF are in before the loop looks at the EOF."""

    def __init__(self) -> None:
        self.status_event = threading.Event()
        self.status_event.set()
        self.eof_received = False
        self._buffer = b""
        self._looks = 0

    def settimeout(self, _: float) -> None: ...
    def exec_command(self, _: str) -> None: ...
    def sendall(self, _: bytes) -> None: ...
    def shutdown_write(self) -> None: ...
    def close(self) -> None: ...

    def recv_ready(self) -> bool:
        self._looks += 1
        if self._looks == 2:  # the output and the EOF arrive now, after the first look
            self._buffer, self.eof_received = b"29500\n", True
            return False  # this look was taken just before they came
        return bool(self._buffer)

    def recv(self, size: int) -> bytes:
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_stderr(self, _: int) -> bytes:
        return b""

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 0


class Transport:
    def __init__(self, channel: LateOutputChannel) -> None:
        self.channel = channel

    def open_session(self, timeout: float) -> Any:
        return self.channel


def test_output_that_comes_with_the_eof_is_read_whole() -> None:
    channel = LateOutputChannel()
    code, out, err, cut = ssh._exec(Transport(channel), "free port", None, 5.0, 1024)  # type: ignore[arg-type]
    assert (code, out, err, cut) == (0, b"29500\n", b"", False)
