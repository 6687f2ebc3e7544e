"""Estimate a job's restart overhead (seconds) from its own recoveries, for the spot policies.

A restart's overhead is the time from losing the nodes (or deciding to move) to training
making progress again: launch, sync, setup and resume. Pure; the controller measures the
durations and passes them in, oldest first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DEFAULT_PRIOR_S", "DEFAULT_WINDOW", "estimate_restart_overhead"]

DEFAULT_PRIOR_S = 12 * 60.0
"""Overhead assumed before a job has recovered once: 12 minutes (the paper's 0.2 h)."""

DEFAULT_WINDOW = 5
"""How many of the latest recoveries the estimate looks at."""


def estimate_restart_overhead(
    recoveries_s: Sequence[float],
    *,
    prior_s: float = DEFAULT_PRIOR_S,
    window: int = DEFAULT_WINDOW,
) -> float:
    """The overhead to plan with: `prior_s` until the job has recovered, then the longest of its
    latest `window` recoveries.

    The longest, not the mean: the safety net keeps room for two restarts, and it only keeps
    the deadline when no restart takes longer than the estimate; the window lets the estimate
    follow a job whose restarts got faster (a warm cache, a smaller checkpoint).
    Raises ValueError on a negative or non-finite duration, prior, or a window below 1.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    if not math.isfinite(prior_s) or prior_s < 0:
        raise ValueError(f"prior_s must be a finite number of seconds >= 0, got {prior_s}")
    for value in recoveries_s:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a recovery duration must be finite and >= 0, got {value}")
    recent = list(recoveries_s)[-window:]
    return max(recent) if recent else prior_s
