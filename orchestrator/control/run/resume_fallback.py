"""A restart that could not load the checkpoint it resumed falls back, once, to the one before.

Setting aside what survivors hold (`orchestrator.cluster.checkpoints.set_aside`) keeps the
nodes consistent, but a checkpoint can still fail to load: a file spoiled on its way, a
script that picks its own. So when a run that resumed a step fails soon after its start,
before it reported any progress, and its failure reads as a checkpoint that could not be
loaded (`orchestrator.node.failure.checkpoint_load_error`), orch holds that checkpoint back
and restarts once on the same nodes from the newest complete one before it (a FALLBACK
event); the held-back one is set aside on every node like a newer step. Once per
interruption: a run started by a fallback that fails the same way fails the job.

`fallback_due` is the pure rule, over the job's events; the runner acts on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from orchestrator.node.failure import checkpoint_load_error
from orchestrator.spot.inputs import PROGRESS_EVENT

FALLBACK_EVENT = "FALLBACK"
LOAD_WINDOW_S = 600.0  # a failure later than this after the start is not the load's
RESUMED_EVENT = "RESUMED"
STARTED_EVENT = "RUNNING"
INTERRUPTED_EVENT = "PREEMPTED"


class EventLike(Protocol):
    """What the rule reads of a job's event (`orchestrator.ledger.store.Event`)."""

    kind: str
    at: datetime
    step: int | None


@dataclass(frozen=True)
class FailedLoad:
    """A run that could not load what it resumed."""

    step: int  # the step it resumed
    error: str  # the failing rank's exception line


def fallback_due(
    report: str,
    events: Sequence[EventLike],
    now: datetime,
    *,
    window_s: float = LOAD_WINDOW_S,
) -> FailedLoad | None:
    """The failed load to fall back from, or None: the job's last run (its last RUNNING
    event) resumed a step (RESUMED with a step), reported no progress, failed within
    `window_s` of its start with a failure that `report` (`failure_report`'s text) reads as a
    checkpoint that could not be loaded, and no fallback happened since the job's last
    interruption (PREEMPTED) or its start."""
    starts = [i for i, e in enumerate(events) if e.kind == STARTED_EVENT]
    if not starts:
        return None
    started = events[starts[-1]]
    since = events[starts[-1] + 1 :]
    resumed = [e for e in since if e.kind == RESUMED_EVENT]
    if not resumed or resumed[-1].step is None:
        return None
    if any(e.kind == PROGRESS_EVENT for e in since):
        return None
    if (now - started.at).total_seconds() > window_s:
        return None
    interrupted = [i for i, e in enumerate(events) if e.kind == INTERRUPTED_EVENT]
    after = events[interrupted[-1] + 1 :] if interrupted else events
    if any(e.kind == FALLBACK_EVENT for e in after):
        return None
    error = checkpoint_load_error(report)
    return FailedLoad(resumed[-1].step, error) if error is not None else None
