"""What the live controller feeds the spot policies, measured from the job itself (pure).

- Work: the trainer's progress lines carry `step` and `total_steps`; `StepRate` turns the
  times they arrive at into steps per second, so work left = (total - step) / rate seconds.
- Restart overhead: `restart_durations` reads the job's events; each start runs from what began
  it (PROVISIONING of a first launch or of a launch after waiting, PREEMPTED of a recovery,
  SWITCHING of a planned move) to its first progress line (TRAINING).
- `DriverState`: what the driver keeps between decisions and across controller restarts (the
  market in force, the policy's own state, the step rate), stored as JSON in the ledger.
- `fallback_decision`: the market to take while the work is not known yet.

No I/O here; `orchestrator.spot.driver` does the asking and the recording.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from orchestrator.spot.policies import Decision, PolicyInputs, PolicyState, Running

__all__ = [
    "DRIVER_STATE_VERSION",
    "PROGRESS_EVENT",
    "DriverState",
    "StepRate",
    "Work",
    "fallback_decision",
    "restart_durations",
    "running_on",
]

PROGRESS_EVENT = "TRAINING"
"""Event kind of the first progress line of a run: where a restart's overhead ends."""

_LAUNCH_KIND = "PROVISIONING"
_RESTART_KINDS = frozenset({"PREEMPTED", "SWITCHING"})
_RESET_KINDS = frozenset({"WAITING", "ADOPTED", "RESTARTED"})

DRIVER_STATE_VERSION = 2
"""2: the line of uniform progress starts at a share of the job done; 1 kept it in seconds of
compute at the step rate of the time (read and converted)."""

MIN_RATE_SPAN_S = 2.0
"""Shortest stretch of one run a step rate is measured over (progress lines arrive in bursts)."""


def restart_durations(events: Iterable[tuple[str, datetime]]) -> list[float]:
    """Seconds each start of the job took until training made progress, oldest first.

    `events` are (kind, time) in ledger order. A start ends at a TRAINING event. It begins at
    the latest PREEMPTED or SWITCHING event before that (the old nodes are lost from then on),
    or else at the first PROVISIONING event since the previous TRAINING event (a first launch,
    or a launch after waiting). Waiting (WAITING) is not overhead, nor is the time a dead
    controller left behind (ADOPTED, RESTARTED): those drop the start being measured.
    """
    durations: list[float] = []
    began: datetime | None = None
    for kind, at in events:
        if kind == PROGRESS_EVENT:
            if began is not None:
                durations.append(max(0.0, (at - began).total_seconds()))
            began = None
        elif kind in _RESET_KINDS:
            began = None
        elif kind in _RESTART_KINDS or (kind == _LAUNCH_KIND and began is None):
            began = at
    return durations


class StepRate:
    """Steps per second of the job, measured over each run from its progress lines.

    Lines arrive in reads (one per watch tick) and `add` gets the read's time for each line
    of it. The newest line of a read was printed closest to that time, so a run's measurement
    starts at the newest line of its first read: starting at the oldest would take the time
    between that line and the read as no time at all, and overstate the rate by up to one
    watch interval over the length of the run.

    `new_run()` when a run (re)starts: a run's first read only marks where its measurement
    begins, since the time before it is start-up, not training. The rate of the latest run
    that lasted `MIN_RATE_SPAN_S` is kept across restarts until the next run has its own.
    """

    def __init__(self, rate: float | None = None) -> None:
        self.rate = rate  # steps per second; None until measured
        self._first: tuple[float, int] | None = None

    def new_run(self) -> None:
        self._first = None

    def add(self, at_s: float, step: int) -> None:
        """A progress line of step `step`, read at `at_s` (seconds on a monotonic clock; the
        same value for every line of one read)."""
        first = self._first
        # A new run, a step going back (a resume without new_run()), or a newer line of the
        # run's first read: the measurement starts here.
        if first is None or step < first[1] or at_s <= first[0]:
            self._first = (at_s, step)
            return
        span, steps = at_s - first[0], step - first[1]
        if span >= MIN_RATE_SPAN_S and steps > 0:
            self.rate = steps / span


@dataclass(frozen=True)
class Work:
    """A job's work in seconds of compute, from steps and a step rate."""

    step: int  # steps done (that a restart would resume from)
    total_steps: int  # the step the run ends at
    steps_per_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.steps_per_s) and self.steps_per_s > 0):
            raise ValueError(f"steps_per_s must be positive, got {self.steps_per_s}")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {self.total_steps}")

    @property
    def total_s(self) -> float:
        return self.total_steps / self.steps_per_s

    @property
    def left_s(self) -> float:
        return max(0, self.total_steps - self.step) / self.steps_per_s

    def inputs(
        self,
        *,
        time_left_s: float,
        total_time_s: float,
        restart_overhead_s: float,
        spot_available: bool,
        running: Running,
        spot_price: Decimal,
        on_demand_price: Decimal,
        decision_interval_s: float,
        spent_usd: Decimal | None = None,
    ) -> PolicyInputs:
        """The policy's inputs at one decision point, with this work."""
        return PolicyInputs(
            work_left_s=self.left_s,
            time_left_s=time_left_s,
            total_work_s=self.total_s,
            total_time_s=total_time_s,
            restart_overhead_s=restart_overhead_s,
            spot_available=spot_available,
            running=running,
            spot_price=spot_price,
            on_demand_price=on_demand_price,
            decision_interval_s=decision_interval_s,
            spent_usd=spent_usd,
        )


def running_on(market: str | None) -> Running:
    """`Running` for an instance market ("spot", "on-demand") or None (no node)."""
    if market == "spot":
        return Running.SPOT
    if market == "on-demand":
        return Running.ON_DEMAND
    return Running.NOTHING


def fallback_decision(
    policy: str, *, spot_available: bool, spot_pays: bool, running: Running
) -> Decision:
    """The market while the work left is unknown (no step rate or total steps yet).

    A running node is kept (nothing is known that would pay for a move). Otherwise: spot when
    it can be had, pays and the policy uses spot; else on-demand, except `spot-only`, which
    waits. Never waits under a deadline policy: with the work unknown, waiting might cost the
    deadline.
    """
    if running is Running.SPOT:
        return Decision.SPOT
    if running is Running.ON_DEMAND:
        return Decision.ON_DEMAND
    if policy == "on-demand":
        return Decision.ON_DEMAND
    if spot_available and (spot_pays or policy == "spot-only"):
        return Decision.SPOT
    return Decision.WAIT if policy == "spot-only" else Decision.ON_DEMAND


@dataclass(frozen=True)
class DriverState:
    """What the deadline driver keeps, in the ledger (`Job.policy_state`) as JSON."""

    market: Decision | None = None  # the decision in force; None before the first one
    policy: PolicyState = field(default_factory=PolicyState)
    steps_per_s: float | None = None  # the last measured step rate
    total_steps: int | None = None  # what the trainer last said it runs to
    zone: str | None = None  # zone-aware policies: the zone of the decision in force
    ran_in: str | None = None  # zone-aware policies: where the job last ran (its checkpoint's
    #                            zone: a start elsewhere is a move between zones)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": DRIVER_STATE_VERSION,
                "market": None if self.market is None else self.market.value,
                "committed_on_demand": self.policy.committed_on_demand,
                "line_start": None if self.policy.line_start is None else [*self.policy.line_start],
                "steps_per_s": self.steps_per_s,
                "total_steps": self.total_steps,
                "zone": self.zone,
                "ran_in": self.ran_in,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | None) -> DriverState:
        """Read a stored state; a missing or unreadable one is a fresh start."""
        if not text:
            return cls()
        try:
            doc = json.loads(text)
            market = None if doc.get("market") is None else Decision(doc["market"])
            line = doc.get("line_start")
            rate = doc.get("steps_per_s")
            total = doc.get("total_steps")
            line_start = None if line is None else (float(line[0]), float(line[1]))
            if line_start is not None and doc.get("version", 1) < 2:
                line_start = _line_in_shares(line_start, rate, total)
            return cls(
                market=market,
                policy=PolicyState(
                    committed_on_demand=bool(doc.get("committed_on_demand", False)),
                    line_start=line_start,
                ),
                steps_per_s=None if rate is None else float(rate),
                total_steps=None if total is None else int(total),
                zone=_text(doc.get("zone")),
                ran_in=_text(doc.get("ran_in")),
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return cls()


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _line_in_shares(
    line: tuple[float, float], rate: float | None, total: int | None
) -> tuple[float, float] | None:
    """A version 1 line start (elapsed s, progress s) as (elapsed s, done fraction); None (the
    line starts again at the next tight decision) without the rate and total to convert."""
    if not rate or not total:
        return None
    return line[0], min(1.0, max(0.0, line[1] * float(rate) / int(total)))
