"""Pure rules of spot recovery: what an interruption is, and the numbers a recovery obeys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from orchestrator.backoff import backoff_s

Cause = Literal["notice", "preempted", "lost"]

NOTICE_MARGIN_S = 3.0  # the emergency checkpoint must be pulled this long before the reclaim


@dataclass(frozen=True)
class Interruption:
    """Nodes of a job that are gone or about to go.

    `notice`: a spot notice was posted (the nodes still run until `reclaim_at`);
    `preempted`: the provider says it took the nodes back; `lost`: they stopped answering on
    several checks in a row and the provider did not say why.
    """

    ranks: tuple[int, ...]  # node ranks in the current cluster
    # The same nodes' ids, in the same order; ranks past its end have no node known (a job
    # rebuilt from its nodes after its ledger died, whose node of that rank had ended).
    instance_ids: tuple[str, ...]
    cause: Cause
    detail: str  # what was seen, for the event log
    detected_at: datetime  # UTC
    reclaim_at: datetime | None = None  # notice: when the cloud takes the nodes

    def describe(self) -> str:
        ids = self.instance_ids + ("no node known",) * (len(self.ranks) - len(self.instance_ids))
        nodes = ", ".join(f"node {rank} ({iid})" for rank, iid in zip(self.ranks, ids, strict=True))
        return f"{nodes}: {self.detail}"


def may_recover(recoveries_done: int, max_recoveries: int) -> bool:
    """Whether one more recovery is allowed after `recoveries_done` of them."""
    return recoveries_done < max_recoveries


def salvage_seconds(interruption: Interruption, now: datetime, stop_grace_s: float) -> float:
    """How long trainers get to write their emergency checkpoint after SIGTERM.

    With a notice: until NOTICE_MARGIN_S before the reclaim (so the pull still fits), never more
    than `stop_grace_s`, never less than 0. Without a notice the nodes are already gone: 0.
    """
    if interruption.cause != "notice" or interruption.reclaim_at is None:
        return 0.0
    left = (interruption.reclaim_at - now).total_seconds() - NOTICE_MARGIN_S
    return max(0.0, min(stop_grace_s, left))


def backoff_seconds(attempt: int, first_s: float, cap_s: float = 300.0) -> float:
    """Wait before launch retry `attempt` (1-based): `first_s`, doubling, at most `cap_s`."""
    return backoff_s(attempt, first_s, cap_s)
