"""How many examples a property test runs, and how many rounds a random-moment trial: a
quarter of the examples (at least 25) and the short trial in the regular suite, which must stay
short on two cores; everything with ORCH_FULL_FUZZ=1, as `make soak` sets."""

from __future__ import annotations

import os

FULL_FUZZ = os.environ.get("ORCH_FULL_FUZZ") == "1"


def examples(full: int) -> int:
    """The number of examples to run for a property written for `full`."""
    return full if FULL_FUZZ else max(25, full // 4)


def trials(full: int, short: int) -> int:
    """`full` rounds (or seconds) of a random-moment trial under ORCH_FULL_FUZZ=1, else `short`."""
    return full if FULL_FUZZ else short
