"""Spot availability traces: load and validate one, and ask it about a moment of wall time.

File format (the one of skypilot-org/spot-traces, see traces/README.md):

    {"metadata": {"gap_seconds": 195}, "data": [1, 1, 0, 0, 1, ...]}

one value every `gap_seconds`: how many spot instances could be had during that tick (1-node
traces hold 0 or 1; a 16-node trace 0 to 16). Tick i covers trace time
[i * gap, (i + 1) * gap). A job of N nodes can have spot during a tick whose value is >= N.

`load_trace` is the only function here that does I/O.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from orchestrator.errors import TraceError

__all__ = ["MAX_TRACE_BYTES", "SpotTrace", "TraceClock", "load_trace", "parse_trace"]

MAX_TRACE_BYTES = 64 * 1024 * 1024
"""Largest trace file accepted (64 MiB: years of 1-second ticks would not fit, months do)."""

_HINT = 'a trace is JSON: {"metadata": {"gap_seconds": N}, "data": [0, 1, ...]}'


@dataclass(frozen=True)
class SpotTrace:
    """A validated availability trace."""

    name: str  # where it came from (the file's name), for tables and messages
    gap_s: float  # seconds between two values (> 0)
    counts: tuple[int, ...]  # spot instances obtainable per tick (>= 0), at least one tick

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def duration_s(self) -> float:
        """Trace time covered by all the ticks."""
        return len(self.counts) * self.gap_s

    def available(self, tick: int, nodes: int = 1) -> bool:
        """Can a job of `nodes` nodes have spot during tick `tick`?"""
        return self.counts[tick] >= nodes

    def availability(self, nodes: int = 1) -> tuple[bool, ...]:
        """`available(i, nodes)` for every tick i."""
        return tuple(count >= nodes for count in self.counts)

    def spot_fraction(self, nodes: int = 1) -> float:
        """Share of ticks during which a job of `nodes` nodes can have spot."""
        return sum(self.availability(nodes)) / len(self.counts)


def parse_trace(document: object, name: str) -> SpotTrace:
    """Validate a decoded trace document; TraceError (exit 2) saying what is wrong."""
    if not isinstance(document, dict):
        raise TraceError(f"{name}: the trace must be a JSON object", hint=_HINT)
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or "gap_seconds" not in metadata:
        raise TraceError(f"{name}: metadata.gap_seconds is missing", hint=_HINT)
    gap = metadata["gap_seconds"]
    if (
        isinstance(gap, bool)
        or not isinstance(gap, int | float)
        or not math.isfinite(gap)
        or gap <= 0
    ):
        raise TraceError(
            f"{name}: metadata.gap_seconds must be a positive number of seconds, got {gap!r}",
            hint=_HINT,
        )
    data = document.get("data")
    if not isinstance(data, list) or not data:
        raise TraceError(f"{name}: data must be a non-empty list of counts", hint=_HINT)
    for index, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceError(
                f"{name}: data[{index}] must be a whole number >= 0, got {value!r}",
                hint="each value is how many spot instances could be had during that tick",
            )
    return SpotTrace(name=name, gap_s=float(gap), counts=tuple(data))


def load_trace(path: str | os.PathLike[str]) -> SpotTrace:
    """Read and validate the trace file at `path`; TraceError (exit 2) on any problem."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise TraceError(
            f"cannot read trace {file}: {exc.strerror or exc}",
            hint="give the path of a trace file, e.g. traces/*.json",
        ) from None
    if len(raw) > MAX_TRACE_BYTES:
        raise TraceError(f"{file.name}: larger than {MAX_TRACE_BYTES // 2**20} MiB", hint=_HINT)
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{file.name}: not valid JSON ({exc})", hint=_HINT) from None
    return parse_trace(document, file.name)


@dataclass(frozen=True)
class TraceClock:
    """A trace replayed against wall time: it starts at `started_at`, `time_scale` trace
    seconds pass per wall second (3600: an hour of trace per second). Before the start the
    first tick holds, after the end the last one does.
    """

    trace: SpotTrace
    started_at: datetime  # timezone-aware (UTC)
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.started_at.tzinfo is None:
            raise ValueError("started_at must be timezone-aware (UTC)")
        if not math.isfinite(self.time_scale) or self.time_scale <= 0:
            raise ValueError(f"time_scale must be a positive number, got {self.time_scale}")

    def trace_seconds(self, at: datetime) -> float:
        """Trace time at wall time `at` (negative before the start)."""
        return (at - self.started_at).total_seconds() * self.time_scale

    def tick_at(self, at: datetime) -> int:
        """Index of the tick in force at wall time `at`, clamped to the trace."""
        tick = math.floor(self.trace_seconds(at) / self.trace.gap_s)
        return min(max(tick, 0), len(self.trace) - 1)

    def spot_count(self, at: datetime) -> int:
        """Spot instances obtainable at wall time `at`."""
        return self.trace.counts[self.tick_at(at)]

    def spot_available(self, at: datetime, nodes: int = 1) -> bool:
        """Can a job of `nodes` nodes have spot at wall time `at`?"""
        return self.spot_count(at) >= nodes

    def tick_start(self, tick: int) -> datetime:
        """Wall time at which tick `tick` begins."""
        return self.started_at + timedelta(seconds=tick * self.trace.gap_s / self.time_scale)

    def next_change(self, at: datetime, nodes: int = 1) -> datetime | None:
        """Wall time after `at` when `spot_available(nodes)` next flips; None if it never does."""
        tick = self.tick_at(at)
        now = self.trace.counts[tick] >= nodes
        for later in range(tick + 1, len(self.trace)):
            if (self.trace.counts[later] >= nodes) != now:
                return self.tick_start(later)
        return None
