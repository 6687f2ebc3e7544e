"""Deadline-aware spot policies: at a decision point, run on spot, on on-demand, or wait.

Pure functions of plain values, shared by the live controller and the simulator
(`orchestrator.spot.simulate`). The model is the one of "Can't Be Late: Optimizing Spot Instance
Savings under Deadlines" (Wu et al., NSDI 2024):

- The job needs `total_work_s` seconds of compute and must be done `total_time_s` seconds after
  it was submitted. At any time it is idle, on spot, or on on-demand (for a multi-node job: all
  nodes on one market, or none).
- Every (re)start on a new instance costs `restart_overhead_s` seconds that make no progress
  (launch, setup, resume from the last checkpoint); stopping costs nothing.
- On-demand can always be had; spot only while the provider has it, and a spot instance is
  taken away when it stops having it.

Contract of every policy's `decide(inputs, state) -> (decision, new_state)`:

- Pure: the answer depends only on its arguments; the state a policy carries between decision
  points (`PolicyState`) goes in and comes out, so the caller keeps it (and may persist it).
- Never SPOT while spot is not available; WAIT once no work is left (Thrifty rule).
- A spot instance that is still running is kept (Exploitation rule: spot progress is the
  cheapest there is), except by `on-demand`, which never uses spot.
- Safety net (`greedy`, `uniform-progress`): when not on spot and waiting until the next
  decision point would leave less than `work_left + 2 x restart_overhead` before the deadline,
  go on-demand and stay there for good. Hence: when the deadline is feasible at the start
  (all on-demand would make it) and restarts take no longer than `restart_overhead_s`, these
  policies meet it.
- Never above on-demand (`greedy`, `uniform-progress`): the savings are what the progress made
  would have cost on on-demand less the bill so far. A spot instance is started only while the
  savings, less the start's restart at the spot price, stay above -`OVERRUN_RESTARTS` restarts
  at the on-demand price; once they cannot pay for one, on-demand for good. Hence, on any trace,
  they cost at most on-demand from the start plus `OVERRUN_RESTARTS` restarts at the on-demand
  price (finishing on on-demand from any point costs the bill plus (work left + a restart) x
  the on-demand price, that is on-demand from the start less the savings). No policy that ever
  tries spot can promise less than one restart at the spot price: its first spot instance may
  be taken back as soon as its restart is done.
- `spot-only` never uses on-demand and may miss the deadline; it is the cheapest bound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from enum import StrEnum
from typing import Protocol

from orchestrator.errors import SpecError

__all__ = [
    "POLICY_NAMES",
    "Decision",
    "GreedyPolicy",
    "OnDemandPolicy",
    "PolicyInputs",
    "PolicyState",
    "Running",
    "SpotOnlyPolicy",
    "SpotPolicy",
    "UniformProgressPolicy",
    "get_policy",
]


class Decision(StrEnum):
    """What to run on until the next decision point."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    WAIT = "wait"  # no instance at all


class Running(StrEnum):
    """What the job runs on when the decision is made."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    NOTHING = "nothing"


@dataclass(frozen=True, slots=True)
class PolicyInputs:
    """Everything a policy sees at one decision point. Durations in seconds, prices in USD/h."""

    work_left_s: float  # compute still needed to finish (from step rate and target steps)
    time_left_s: float  # until the deadline; negative once it has passed
    total_work_s: float  # compute the whole job needs (C(0) in the paper)
    total_time_s: float  # from submit to the deadline (R(0) in the paper)
    restart_overhead_s: float  # a (re)start's cost in time: launch, setup, resume
    spot_available: bool  # a spot instance (all the job's nodes) can be had now
    running: Running  # a spot instance reported here is still alive (not reclaimed)
    spot_price: Decimal  # per node-hour
    on_demand_price: Decimal  # per node-hour
    decision_interval_s: float = 0.0  # time to the next decision point (simulator: a tick)
    spent_usd: Decimal | None = None  # billed so far, per node; None: unknown (no savings rule)

    @property
    def elapsed_s(self) -> float:
        """Time since submit."""
        return self.total_time_s - self.time_left_s

    @property
    def progress_s(self) -> float:
        """Compute done so far: cp(t) in the paper."""
        return self.total_work_s - self.work_left_s

    @property
    def done_fraction(self) -> float:
        """Share of the whole job done so far, 0 to 1. Unlike `progress_s` it does not move
        when the live controller measures the step rate again."""
        if self.total_work_s <= 0:
            return 1.0
        return min(1.0, max(0.0, self.progress_s / self.total_work_s))

    @property
    def spot_pays(self) -> bool:
        """Spot is cheaper than on-demand; otherwise the deadline-aware policies skip it."""
        return self.spot_price < self.on_demand_price


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What a policy remembers between decision points. Start a job with `PolicyState()`."""

    committed_on_demand: bool = False  # the safety net fired: on-demand until the end
    line_start: tuple[float, float] | None = None  # uniform-progress: (elapsed_s, done
    # fraction) where its line of uniform progress starts; None until the deadline is tight


class SpotPolicy(Protocol):
    """One decision rule; see the module docstring for the contract of `decide`."""

    name: str

    def decide(self, inputs: PolicyInputs, state: PolicyState) -> tuple[Decision, PolicyState]: ...


def _safety_net(inputs: PolicyInputs) -> bool:
    """Would waiting until the next decision point leave less than work + 2 restarts?

    Twice the overhead: a spot instance started now may be reclaimed right after its restart,
    and the job must still be able to restart once more, on on-demand, and finish in time.
    """
    slack = inputs.time_left_s - inputs.decision_interval_s - inputs.work_left_s
    return slack < 2 * inputs.restart_overhead_s


OVERRUN_RESTARTS = 1
"""How far above on-demand from the start a deadline-aware policy may end on any trace, in
restarts at the on-demand price (see `_savings_pay_for`)."""

_HOUR = Decimal(3600)


def _savings_pay_for(inputs: PolicyInputs, *restart_prices: Decimal) -> bool:
    """May the job pay for restarts at `restart_prices` (per node-hour) from its savings?

    The savings are what the progress made would have cost on on-demand less the bill so far.
    Finishing on on-demand from here costs the bill plus (work left + a restart) x the on-demand
    price: on-demand from the start less the savings. So while the savings, less the restarts a
    move may lose for nothing (its instance taken back as soon as it is up), stay at or above
    -`OVERRUN_RESTARTS` restarts at the on-demand price, the whole bill does too, whatever the
    trace. True when the bill is unknown.
    """
    if inputs.spent_usd is None:
        return True
    restart_h = Decimal(repr(max(0.0, inputs.restart_overhead_s))) / _HOUR
    progress_value = Decimal(repr(max(0.0, inputs.progress_s))) / _HOUR * inputs.on_demand_price
    savings = progress_value - inputs.spent_usd
    risked = sum((price * restart_h for price in restart_prices), Decimal(0))
    return savings - risked >= -OVERRUN_RESTARTS * restart_h * inputs.on_demand_price


def _spot_running(inputs: PolicyInputs) -> bool:
    return inputs.running is Running.SPOT and inputs.spot_available


def _commit_on_demand(inputs: PolicyInputs, state: PolicyState) -> bool:
    """On-demand for good: already committed, the safety net, spot that does not pay, or
    savings that can no longer pay for a spot start (nothing cheaper is left to try: waiting
    changes neither the bill nor the progress)."""
    if state.committed_on_demand or _safety_net(inputs) or not inputs.spot_pays:
        return True
    return not _savings_pay_for(inputs, inputs.spot_price)


@dataclass(frozen=True)
class OnDemandPolicy:
    """On-demand from start to end: the cost reference."""

    name: str = "on-demand"

    def decide(self, inputs: PolicyInputs, state: PolicyState) -> tuple[Decision, PolicyState]:
        if inputs.work_left_s <= 0:
            return Decision.WAIT, state
        return Decision.ON_DEMAND, replace(state, committed_on_demand=True)


@dataclass(frozen=True)
class SpotOnlyPolicy:
    """Spot whenever it can be had, otherwise wait; never on-demand. Ignores the deadline."""

    name: str = "spot-only"

    def decide(self, inputs: PolicyInputs, state: PolicyState) -> tuple[Decision, PolicyState]:
        if inputs.work_left_s <= 0 or not inputs.spot_available:
            return Decision.WAIT, state
        return Decision.SPOT, state


@dataclass(frozen=True)
class GreedyPolicy:
    """The paper's baseline: spot whenever available, else wait, until the safety net fires."""

    name: str = "greedy"

    def decide(self, inputs: PolicyInputs, state: PolicyState) -> tuple[Decision, PolicyState]:
        if inputs.work_left_s <= 0:
            return Decision.WAIT, state
        if _spot_running(inputs) and not state.committed_on_demand:
            return Decision.SPOT, state
        if _commit_on_demand(inputs, state):
            return Decision.ON_DEMAND, replace(state, committed_on_demand=True)
        return (Decision.SPOT if inputs.spot_available else Decision.WAIT), state


TIGHT_FRACTION = 0.7
"""Work left / time left from which Uniform Progress follows its line (paper, appendix A.8)."""


@dataclass(frozen=True)
class UniformProgressPolicy:
    """Uniform Progress (Wu et al., NSDI 2024, section 5.2): keep up with a straight line of
    progress that reaches the whole job at the deadline.

    While the deadline is loose (work left < `TIGHT_FRACTION` x time left) it acts as greedy
    (spot when available, else wait), as the paper does for loose deadlines (appendix A.8).
    From the first decision point where it is tight, the line runs from that point's
    (elapsed, progress) to (deadline, whole job): ep(t). Then, in order of precedence, with cp
    the progress so far:

    1. Exploitation: stay on a running spot instance until it is reclaimed.
    2. On-demand for good: the safety net (time left < work left + 2 restarts), or savings
       that can no longer pay for a spot start (never above on-demand, module docstring).
    3. Taking risks: spot whenever available, from no instance or from on-demand, even when
       behind the line.
    4. No spot, on on-demand: stay there.
    5. Uniform progress: no spot and cp < ep(t): on-demand, if the savings can pay for the
       move there and back to spot (a restart at each price); otherwise wait, as greedy does,
       for spot or the safety net.
    6. Otherwise (on or ahead of the line, no spot): wait with no instance.

    Rule 3 replaces the paper's hysteresis (on on-demand, stay there until cp >= ep(t + 2d)):
    that rule kept the job on on-demand while spot was up, for hours when the job was far behind
    the line (on a trace with spot 88 % of the time, 7 h of a 40 h job). Moves between markets
    are paid from the savings instead (rules 2 and 5), which bounds what flickering spot can
    cost without keeping spot that is there unused.

    The line is kept as shares of the whole job, not seconds of compute: the live controller
    measures the step rate again as the job runs, which changes what the job's progress and
    whole work are in seconds, and a line kept in seconds would then no longer end at the
    whole job (with a rate found 10 % faster, a job on the line would find itself behind it).
    """

    name: str = "uniform-progress"

    def decide(self, inputs: PolicyInputs, state: PolicyState) -> tuple[Decision, PolicyState]:
        if inputs.work_left_s <= 0:
            return Decision.WAIT, state
        if _spot_running(inputs) and not state.committed_on_demand:
            return Decision.SPOT, state
        if _commit_on_demand(inputs, state):
            return Decision.ON_DEMAND, replace(state, committed_on_demand=True)
        if state.line_start is None and inputs.work_left_s >= TIGHT_FRACTION * inputs.time_left_s:
            state = replace(state, line_start=(inputs.elapsed_s, inputs.done_fraction))
        if inputs.spot_available:
            return Decision.SPOT, state
        if inputs.running is Running.ON_DEMAND:
            return Decision.ON_DEMAND, state
        behind = state.line_start is not None and inputs.done_fraction < _expected_fraction(
            inputs, state.line_start, 0.0
        )
        if behind and _savings_pay_for(inputs, inputs.on_demand_price, inputs.spot_price):
            return Decision.ON_DEMAND, state
        return Decision.WAIT, state


def _expected_fraction(
    inputs: PolicyInputs, line_start: tuple[float, float], later_s: float
) -> float:
    """ep(t + later_s) / whole job: the share of the job done on the line from `line_start`
    (elapsed, done fraction) to (deadline, all of it)."""
    start_elapsed, start_done = line_start
    span = inputs.total_time_s - start_elapsed
    if span <= 0:
        return 1.0
    return start_done + (1.0 - start_done) * (inputs.elapsed_s + later_s - start_elapsed) / span


_POLICIES: dict[str, SpotPolicy] = {
    policy.name: policy
    for policy in (UniformProgressPolicy(), GreedyPolicy(), OnDemandPolicy(), SpotOnlyPolicy())
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)
"""Every policy by name: uniform-progress, greedy, on-demand, spot-only."""


def get_policy(name: str) -> SpotPolicy:
    """The policy called `name`; SpecError (exit 2) naming the known ones otherwise."""
    try:
        return _POLICIES[name]
    except KeyError:
        raise SpecError(
            f"unknown spot policy {name!r}",
            hint=f"use one of: {', '.join(POLICY_NAMES)}",
        ) from None
