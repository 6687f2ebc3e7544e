"""How many examples a property test runs: a quarter (at least 25) in the regular suite, which
must stay short on two cores, and every one with ORCH_FULL_FUZZ=1, as `make soak` sets."""

from __future__ import annotations

import os

FULL_FUZZ = os.environ.get("ORCH_FULL_FUZZ") == "1"


def examples(full: int) -> int:
    """The number of examples to run for a property written for `full`."""
    return full if FULL_FUZZ else max(25, full // 4)
