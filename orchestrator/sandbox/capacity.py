"""Which (zone, market) pairs of the sandbox refuse launches for lack of capacity.

Everything has capacity until told otherwise (`orch sandbox capacity ZONE --none`). Refused
launches answer like EC2 does when a zone runs out: `InsufficientInstanceCapacity`, HTTP 500.
Thread-safe: the gateway reads it while the control API changes it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from orchestrator.sandbox.pricing import MARKETS


def markets_named(market: str) -> tuple[str, ...]:
    """ "spot", "on-demand", or "all" (both) as a tuple of markets; ValueError otherwise."""
    if market == "all":
        return MARKETS
    if market in MARKETS:
        return (market,)
    raise ValueError(f"unknown market {market!r}: choose spot, on-demand or all")


class Capacity:
    """The set of (zone, market) pairs without capacity."""

    def __init__(self) -> None:
        self._refused: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def set(self, zones: Iterable[str], market: str, *, available: bool) -> None:
        """Give (`available`) or take away capacity for `market` in each of `zones`."""
        pairs = {(zone, m) for zone in zones for m in markets_named(market)}
        with self._lock:
            if available:
                self._refused -= pairs
            else:
                self._refused |= pairs

    def refuses(self, zone: str, market: str) -> bool:
        with self._lock:
            return (zone, market) in self._refused

    def refused(self) -> list[dict[str, str]]:
        """JSON-ready: every pair without capacity, sorted."""
        with self._lock:
            pairs = sorted(self._refused)
        return [{"zone": zone, "market": market} for zone, market in pairs]
