"""Exponential backoff: the one rule for how long to wait before trying again.

Pure; imports nothing of ours. Each retrying caller keeps its own first wait and cap (a spot
launch refused for capacity, a repeated RunInstances, a failed checkpoint collection).
"""

from __future__ import annotations


def backoff_s(attempt: int, first_s: float, cap_s: float, jitter: float = 1.0) -> float:
    """Seconds to wait before retry `attempt` (1-based; 0 and below count as 1): `first_s`,
    doubling with each attempt, at most `cap_s`, times `jitter` (a draw in [0, 1) for full
    jitter as botocore's standard retry mode does; 1.0, the default, for none)."""
    return jitter * min(cap_s, first_s * 2 ** max(0, attempt - 1))
