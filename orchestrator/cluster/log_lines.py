"""The lines of a job's mirrored node logs as `orch logs` shows them: each with its node, its
global rank (from torchrun's prefix) and the time the controller pulled it.

`LogReader` reads one node's log as a stream (`cluster.log_files`) from where it stopped, so
following a log across rotations neither repeats nor skips a line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.cluster import log_files
from orchestrator.node.progress import local_rank_line
from orchestrator.remote.lines import Line, LineSplitter

READ_CHUNK = 1024 * 1024  # bytes of a log read at a time


@dataclass(frozen=True)
class LogLine:
    """One line of a node log."""

    node: int  # node rank
    rank: int | None  # global rank of the process that printed it; None: no rank prefix
    text: str  # the line without torchrun's `[default<local rank>]:` prefix
    raw: str  # the line as the log holds it (control characters replaced)
    at: datetime | None  # when the controller pulled it (UTC); None: not recorded


def log_line(
    line: Line, *, node: int, gpus_per_node: int, times: list[tuple[int, datetime]]
) -> LogLine:
    """The `LogLine` of one line of a node log (`times`: its `log_files.pull_times`). Pure."""
    local, text = local_rank_line(line.text)
    rank = None if local is None else node * gpus_per_node + local
    return LogLine(node, rank, text, line.text, log_files.time_at(times, line.start))


class LogReader:
    """Reads the whole lines of one node log that arrived since the last `read`.

    Lines end at a newline or a carriage return (a progress bar's redraws are lines of their
    own); their text is `remote.lines.printable` (a node's control characters never reach the
    terminal), and a line longer than `remote.lines.DEFAULT_MAX_LINE` is cut. The log is read
    in pieces of `READ_CHUNK` bytes, and a line still being written is held (at most the line
    cap), so a reader's memory does not grow with the log or with a line that never ends."""

    def __init__(self, path: Path, node: int, gpus_per_node: int) -> None:
        self.path = path
        self.node = node
        self.gpus_per_node = gpus_per_node
        self.consumed = 0  # stream position read up to
        self.seen = False  # the log held something
        self._splitter = LineSplitter(split_cr=True)

    def read(self, *, final: bool) -> list[LogLine]:
        """New lines; a line still being written waits for its newline unless `final`."""
        lines: list[Line] = []
        while True:
            first, data = log_files.read_from(self.path, self.consumed, READ_CHUNK)
            if first != self.consumed:  # bytes rotated out unread: a line of them is lost
                self._splitter = LineSplitter(position=first, split_cr=True)
            lines += self._splitter.feed(data)
            self.consumed = first + len(data)
            if len(data) < READ_CHUNK:
                break
        if final:
            lines += self._splitter.flush()
        self.seen = self.seen or self.consumed > 0
        if not lines:
            return []
        times = log_files.pull_times(self.path)
        return [
            log_line(line, node=self.node, gpus_per_node=self.gpus_per_node, times=times)
            for line in lines
        ]
