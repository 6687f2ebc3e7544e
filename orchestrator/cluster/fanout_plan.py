"""The shape of a fan-out: which node takes the uplink, and which node sends to which. Pure.

A doubling tree: every node that holds the data sends it to one that does not, so the number
of holders doubles with each round of equal-length copies, and N nodes are served in
ceil(log2 N) rounds. `Spread` hands out the copies as they finish rather than round by round,
so a fast copy (to a node that held an earlier copy and needs a small delta) frees its two
nodes at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def uplink_rank(ranks: Sequence[int], holders: Sequence[int]) -> int:
    """The node that takes the uplink: the first of `holders` (a node with an earlier copy,
    so the delta is small) that is in the cluster, else the lowest rank."""
    if not ranks:
        raise ValueError("a cluster without nodes")
    for rank in holders:
        if rank in ranks:
            return rank
    return min(ranks)


def fanout_order(ranks: Sequence[int], first: int, holders: Sequence[int]) -> list[int]:
    """The nodes still to serve after `first`: the other holders first (small deltas, so they
    soon send too), then the rest by rank; each once."""
    seen = {first}
    order: list[int] = []
    for rank in [*holders, *sorted(ranks)]:
        if rank in ranks and rank not in seen:
            seen.add(rank)
            order.append(rank)
    return order


@dataclass
class Spread:
    """A doubling tree handed out as copies end. `start()` gives the first copies;
    `finished(source, target)` marks one done and gives the copies it makes possible: both
    its nodes are free senders then. Each target is copied to exactly once."""

    sources: list[int]
    targets: list[int]
    free: list[int] = field(init=False)
    pending: list[int] = field(init=False)
    running: set[tuple[int, int]] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.free = list(self.sources)
        self.pending = [t for t in self.targets if t not in self.sources]

    def _assign(self) -> list[tuple[int, int]]:
        pairs = []
        while self.free and self.pending:
            pair = (self.free.pop(0), self.pending.pop(0))
            self.running.add(pair)
            pairs.append(pair)
        return pairs

    def start(self) -> list[tuple[int, int]]:
        return self._assign()

    def finished(self, source: int, target: int) -> list[tuple[int, int]]:
        self.running.remove((source, target))
        self.free += [source, target]
        return self._assign()

    @property
    def done(self) -> bool:
        return not self.pending and not self.running


def doubling_rounds(first: int, targets: Sequence[int]) -> list[list[tuple[int, int]]]:
    """The copies of `Spread` when every copy takes the same time, round by round."""
    spread = Spread([first], list(targets))
    rounds: list[list[tuple[int, int]]] = []
    wave = spread.start()
    while wave:
        rounds.append(wave)
        nxt: list[tuple[int, int]] = []
        for source, target in wave:
            nxt += spread.finished(source, target)
        wave = nxt
    return rounds


@dataclass
class Meter:
    """Bytes done of a stage and its rate, for a progress line: `rate` over the stage so far."""

    total: int
    started: float
    done: int = 0

    def rate(self, now: float) -> float:
        elapsed = now - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def seconds_left(self, now: float) -> float | None:
        rate = self.rate(now)
        if rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / rate)
