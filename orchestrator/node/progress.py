"""Reading training progress out of a node log (pure).

torchrun tees every local rank's output into the node log with a `[default<local rank>]:`
prefix. On node 0, local rank 0 is global rank 0, whose JSON lines carry the progress:
`{"step": 120, "epoch": 1, "loss": 0.93, "lr": 0.01, "img_s": 812.5, "total_steps": 480}`.
Only `step` is required; any script may print such lines. `total_steps` (the step the run ends
at) lets the deadline-aware spot policies tell how much work is left.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.node.run_progress import json_object, local_rank_line, step_of

__all__ = ["Metrics", "describe_event", "local_rank_line", "parse_metrics", "rank_lines"]


@dataclass(frozen=True)
class Metrics:
    """One progress report of rank 0."""

    step: int
    epoch: float | None = None
    loss: float | None = None
    lr: float | None = None
    img_s: float | None = None
    total_steps: int | None = None  # the step the run ends at, when the trainer says


def parse_metrics(text: str) -> Metrics | None:
    """The metrics in a rank-0 line, or None when the line is not a progress report."""
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
