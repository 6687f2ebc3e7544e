"""Graceful stop: SIGTERM or SIGUSR1 asks the run to stop at the next step boundary.

The handler only records the request; the training loop polls `StopRequest.requested` after
each optimizer step and shares it with the other ranks, so all ranks stop after the same
step, rank 0 saves a checkpoint, and every rank exits with `EXIT_STOPPED` (143, the status
of a process killed by SIGTERM, which the orchestrator reads as "interrupted, resumable").
"""

from __future__ import annotations

import signal
from types import FrameType

EXIT_STOPPED = 143
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records the first stop signal received after `install()`."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
