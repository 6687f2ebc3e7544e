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


@dataclass(frozen=True)
class LogLine:
    """One line of a node log."""

    node: int  # node rank
    rank: int | None  # global rank of the process that printed it; None: no rank prefix
    text: str  # the line without torchrun's `[default<local rank>]:` prefix
    raw: str  # the line as the log holds it
    at: datetime | None  # when the controller pulled it (UTC); None: not recorded


def split_lines(
    data: bytes,
    first: int,
    *,
    node: int,
    gpus_per_node: int,
    times: list[tuple[int, datetime]],
) -> list[LogLine]:
    """The lines of `data`, the log's bytes from stream position `first` on (a last line
    without its newline counts as whole). Pure."""
    lines, position = [], first
    for chunk in data.splitlines(keepends=True):
        raw = chunk.decode(errors="replace").rstrip("\r\n")
        local, text = local_rank_line(raw)
        rank = None if local is None else node * gpus_per_node + local
        lines.append(LogLine(node, rank, text, raw, log_files.time_at(times, position)))
        position += len(chunk)
    return lines


class LogReader:
    """Reads the whole lines of one node log that arrived since the last `read`."""

    def __init__(self, path: Path, node: int, gpus_per_node: int) -> None:
        self.path = path
        self.node = node
        self.gpus_per_node = gpus_per_node
        self.consumed = 0  # stream position read up to
        self.seen = False  # the log held something

    def read(self, *, final: bool) -> list[LogLine]:
        """New lines; a line still being written waits for its newline unless `final`."""
        first, data = log_files.read_from(self.path, self.consumed)
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        self.consumed = first + len(data)
        self.seen = self.seen or self.consumed > 0
        if not data:
            return []
        times = log_files.pull_times(self.path)
        return split_lines(
            data, first, node=self.node, gpus_per_node=self.gpus_per_node, times=times
        )
