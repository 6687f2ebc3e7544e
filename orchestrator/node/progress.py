"""Reading training progress out of a node log (pure).

torchrun tees every local rank's output into the node log with a `[default<local rank>]:`
prefix. On node 0, local rank 0 is global rank 0, whose JSON lines carry the progress:
`{"step": 120, "epoch": 1, "loss": 0.93, "lr": 0.01, "img_s": 812.5, "total_steps": 480}`.
Only `step` is required; any script may print such lines. `total_steps` (the step the run
ends at) lets the deadline-aware spot policies tell how much work is left.

A script that prints plain text has two ways to be read: the job's `progress.pattern` (a
regular expression whose named groups `step`, `total` and `loss` are read; its lines are then
the job's step lines, JSON lines no longer are), or, with neither a pattern nor a JSON step
line, the shapes `orchestrator.node.progress_shapes` recognises (progress bars, `Epoch N`
lines), which are shown and recorded but never judge a start or a stall (`step_line` False).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from orchestrator.node.progress_shapes import ShapeReader
from orchestrator.node.run_progress import (
    STEP_DIGITS,
    compile_pattern,
    json_object,
    local_rank_line,
    pattern_fields,
    step_of,
)

__all__ = [
    "Metrics",
    "ProgressReader",
    "compile_pattern",
    "describe_event",
    "local_rank_line",
    "parse_metrics",
    "rank_lines",
]


@dataclass(frozen=True)
class Metrics:
    """One progress report of rank 0."""

    step: int
    epoch: float | None = None
    loss: float | None = None
    lr: float | None = None
    img_s: float | None = None
    total_steps: int | None = None  # the step the run ends at, when the trainer says
    # A step line (JSON, or the job's pattern): the start and stall timeouts count it. False:
    # a step read from the output's shape, shown and recorded only.
    step_line: bool = True


def parse_metrics(text: str, pattern: re.Pattern[str] | None = None) -> Metrics | None:
    """The metrics in a rank-0 line, or None when the line is not a step line: with the job's
    compiled `pattern`, a line it matches; without, a JSON step line."""
    if pattern is not None:
        return _pattern_metrics(text, pattern)
    step = step_of(text)  # one definition of a progress line, the node guard's too
    if step is None:
        return None
    data = json_object(text) or {}

    def number(key: str) -> float | None:
        value = data.get(key)
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if is_number else None

    total = data.get("total_steps")
    if not isinstance(total, int) or isinstance(total, bool) or total < 1:
        total = None
    return Metrics(
        step, number("epoch"), number("loss"), number("lr"), number("img_s"), total_steps=total
    )


def _pattern_metrics(text: str, pattern: re.Pattern[str]) -> Metrics | None:
    fields = pattern_fields(text, pattern)
    if fields is None:
        return None
    total_text = (fields.get("total") or "").strip()
    total = int(total_text) if STEP_DIGITS.fullmatch(total_text) else None
    try:
        loss: float | None = float(fields.get("loss") or "")
    except ValueError:
        loss = None
    if loss is not None and not math.isfinite(loss):
        loss = None
    return Metrics(fields["step"], loss=loss, total_steps=total if total else None)


class ProgressReader:
    """The progress in rank 0's lines of one run, line by line (`read`): the job's pattern
    when it has one; else JSON step lines, and the output's shapes until a JSON step line is
    read (from then on, JSON lines alone)."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = compile_pattern(pattern)
        self.shapes: ShapeReader | None = None if self.pattern is not None else ShapeReader()
        self.step_lines = False  # a step line was read

    def read(self, text: str) -> Metrics | None:
        """The progress `text` reports, or None."""
        metrics = parse_metrics(text, self.pattern)
        if metrics is not None:
            self.step_lines = True
            return metrics
        if self.shapes is None or self.step_lines:
            return None
        shape = self.shapes.read(text)
        if shape is None:
            return None
        return Metrics(shape.step, epoch=shape.epoch, loss=shape.loss, step_line=False)


def rank_lines(log_text: str, rank: int | None) -> list[str]:
    """Lines of one local rank from a node log (all lines, unprefixed, when rank is None)."""
    lines = []
    for line in log_text.splitlines():
        local, text = local_rank_line(line)
        if rank is None or local == rank:
            lines.append(text if rank is not None else line)
    return lines


def describe_event(text: str) -> str | None:
    """A readable line for a trainer event (`{"event": "checkpoint", "step": 12, ...}`)."""
    data = json_object(text)
    if data is None or not isinstance(data.get("event"), str):
        return None
    details = ", ".join(f"{k} {v}" for k, v in data.items() if k != "event")
    return f"rank 0: {data['event']}" + (f" ({details})" if details else "")
