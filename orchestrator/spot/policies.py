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
- Bill cap (`greedy`, `uniform-progress`): a spot instance is started only while the bill so
  far is at most what the progress made would have cost on on-demand plus `RISK_RESTARTS`
  restarts on on-demand; otherwise on-demand for good. Hence, on any trace, they cost at
  most on-demand from the start plus `RISK_RESTARTS` restarts on on-demand and one restart
  and one decision interval on spot (the last spot start allowed may be reclaimed right after
  its restart).
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
    spent_usd: Decimal | None = None  # billed so far, per node; None: unknown (no bill cap)

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


RISK_RESTARTS = 2
"""Restarts, at the on-demand price, that a deadline-aware policy may lose beyond its savings
(see `_spot_pays_off`): Uniform Progress pays on-demand restarts to keep to its line."""


def _spot_pays_off(inputs: PolicyInputs) -> bool:
    """May a spot instance be started? Only while the bill so far is at most what the progress
    made would have cost on on-demand, plus `RISK_RESTARTS` restarts on on-demand.

    Moving to spot and back costs restarts: a spot instance that is reclaimed before it has
    paid for them (availability in stretches shorter than a few restarts) leaves the job
    dearer than on-demand, and every later try, paid from savings that are not there, makes
    it worse. Finishing on on-demand from here costs (work left + a restart) x the on-demand
    price, so with this cap the whole bill stays within on-demand from the start plus the
    restarts the cap allows and the last spot start's (see the module docstring).
    """
    if inputs.spent_usd is None:
        return True
    hour = Decimal(3600)
    progress_value = Decimal(repr(max(0.0, inputs.progress_s))) * inputs.on_demand_price / hour
    risk = RISK_RESTARTS * Decimal(repr(inputs.restart_overhead_s)) * inputs.on_demand_price / hour
    return inputs.spent_usd <= progress_value + risk


def _spot_running(inputs: PolicyInputs) -> bool:
    return inputs.running is Running.SPOT and inputs.spot_available


def _commit_on_demand(inputs: PolicyInputs, state: PolicyState) -> bool:
    """On-demand for good: already committed, the safety net, spot that does not pay, or
    spot available that the bill cap no longer allows to start."""
    if state.committed_on_demand or _safety_net(inputs) or not inputs.spot_pays:
        return True
    return inputs.spot_available and not _spot_pays_off(inputs)


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
    the progress so far and d the restart overhead:

    1. Exploitation: stay on a running spot instance until it is reclaimed.
    2. Safety net: on-demand for good once time left < work left + 2d.
    3. Hysteresis: on on-demand, stay there until spot is available and cp >= ep(t + 2d), so
       that a spot instance reclaimed right after its restart does not leave the job behind
       the line (and back on on-demand, paying two restarts for nothing).
    4. Taking risks: otherwise spot whenever available, even when behind the line.
    5. Uniform progress: no spot and cp < ep(t): on-demand (and stay, by rule 3).
    6. Otherwise (on or ahead of the line, no spot): wait with no instance.

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
        if state.line_start is None:
            if inputs.work_left_s < TIGHT_FRACTION * inputs.time_left_s:
                return (Decision.SPOT if inputs.spot_available else Decision.WAIT), state
            state = replace(state, line_start=(inputs.elapsed_s, inputs.done_fraction))
        line, done = state.line_start, inputs.done_fraction
        if inputs.running is Running.ON_DEMAND:
            ahead = _expected_fraction(inputs, line, 2 * inputs.restart_overhead_s)
            if inputs.spot_available and done >= ahead:
                return Decision.SPOT, state
            return Decision.ON_DEMAND, state
        if inputs.spot_available:
            return Decision.SPOT, state
        if done < _expected_fraction(inputs, line, 0.0):
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
