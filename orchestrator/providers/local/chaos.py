"""Spot reclaims for soak tests of recovery: seeded random draws, or what a trace takes back
(pure: no I/O)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class ReclaimDraws:
    """The same seed gives the same waits and the same choice of nodes, run after run."""

    def __init__(self, seed: int, rate_per_minute: float) -> None:
        if rate_per_minute <= 0:
            raise ValueError(f"the reclaim rate must be positive, not {rate_per_minute}")
        self._rng = random.Random(seed)
        self.rate_per_s = rate_per_minute / 60.0

    def waits(self) -> Iterator[float]:
        """Seconds between reclaims: exponential (a Poisson process at the given rate)."""
        while True:
            yield self._rng.expovariate(self.rate_per_s)

    def pick(self, nodes: Sequence[T]) -> T:
        """One of `nodes` (pass them in a stable order, e.g. by rank)."""
        if not nodes:
            raise ValueError("no node to pick from")
        return nodes[self._rng.randrange(len(nodes))]


def excess_spot_nodes(held: Sequence[T], granted: int) -> list[T]:
    """The spot nodes a trace takes back: with `granted` spot instances available, a job
    holding `held` (ordered by rank; nodes already being reclaimed left out, as they go
    anyway) loses the excess, highest ranks first."""
    excess = len(held) - max(granted, 0)
    return list(held[len(held) - excess :]) if excess > 0 else []
