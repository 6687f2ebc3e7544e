"""Replay a spot policy on an availability trace: what would the job cost, when would it end?

The model (the one the policies assume, see `orchestrator.spot.policies`):

- Time moves in the trace's ticks. At the start of each tick the policy decides, seeing the
  tick's availability; the decision holds for the whole tick.
- A spot instance is reclaimed when a tick's availability drops below the job's node count
  (the job loses nothing but the instance: checkpoints are taken on the notice).
- Every start on a new instance (the first one, a move between markets, a restart after a
  reclaim) pays `overhead_s` without progress; waiting costs nothing.
- Cost = instance-seconds x the market's price x nodes. A job ends mid-tick when its last
  second of work is done, and it is billed to that second.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from orchestrator.providers.traces import SpotTrace
from orchestrator.spot.policies import (
    Decision,
    PolicyInputs,
    PolicyState,
    Running,
    SpotPolicy,
)

__all__ = [
    "DEFAULT_ON_DEMAND_PRICE",
    "DEFAULT_PRICE_RATIO",
    "Prices",
    "Scenario",
    "SimulationResult",
    "simulate",
]

DEFAULT_ON_DEMAND_PRICE = Decimal("3.06")
"""p3.2xlarge (1 x V100) on-demand in us-east-1, USD per hour: the instance of the traces."""

DEFAULT_PRICE_RATIO = Decimal(1) / Decimal(3)
"""Spot price / on-demand price assumed unless told otherwise."""

_DONE = 1e-6  # seconds of work left that count as none (float rounding of tick arithmetic)
_CENT_FRACTION = Decimal("0.0001")


@dataclass(frozen=True)
class Prices:
    """Prices per node-hour, USD."""

    on_demand: Decimal = DEFAULT_ON_DEMAND_PRICE
    spot: Decimal = DEFAULT_ON_DEMAND_PRICE * DEFAULT_PRICE_RATIO

    @classmethod
    def from_ratio(
        cls, ratio: Decimal = DEFAULT_PRICE_RATIO, on_demand: Decimal = DEFAULT_ON_DEMAND_PRICE
    ) -> Prices:
        """Spot = `ratio` x on-demand."""
        return cls(on_demand=on_demand, spot=on_demand * ratio)


@dataclass(frozen=True)
class Scenario:
    """One job to simulate on a trace."""

    job_s: float  # compute the job needs, seconds (> 0)
    deadline_s: float  # from the start of the job, seconds
    overhead_s: float  # paid on every (re)start, seconds (>= 0)
    prices: Prices = Prices()
    nodes: int = 1  # spot needs this many obtainable instances in a tick
    start_tick: int = 0  # the trace tick the job is submitted at

    def __post_init__(self) -> None:
        if not self.job_s > 0 or not self.deadline_s > 0 or not self.overhead_s >= 0:
            raise ValueError("job_s and deadline_s must be > 0 and overhead_s >= 0")
        if self.nodes < 1 or self.start_tick < 0:
            raise ValueError("nodes must be >= 1 and start_tick >= 0")

    @property
    def feasible(self) -> bool:
        """All on-demand, started at once, would meet the deadline."""
        return self.overhead_s + self.job_s <= self.deadline_s


@dataclass(frozen=True)
class SimulationResult:
    """What a policy did on one scenario."""

    policy: str
    cost: Decimal  # USD, all nodes
    finish_s: float | None  # from the start; None: not done when the trace ran out
    met_deadline: bool
    spot_s: float  # instance-seconds on spot, per node
    on_demand_s: float  # instance-seconds on on-demand, per node
    restarts: int  # instance starts, the first one included
    preemptions: int  # spot instances reclaimed
    gap_to_optimal: float | None = None  # cost / the offline optimum's - 1 (`spot.optimal`);
    # None where no schedule meets the deadline, or where the optimum was not worked out
    zone_switches: int | None = None  # over zones (`spot.zones`): starts outside the
    # checkpoint's zone, each paid the migration; None: a run in one zone

    def as_dict(self) -> dict[str, object]:
        """JSON view: cost in USD, durations in hours; `zone_switches` for a run over zones."""
        view: dict[str, object] = {
            "cost": float(self.cost),
            "finish_hours": None if self.finish_s is None else round(self.finish_s / 3600, 4),
            "met_deadline": self.met_deadline,
            "spot_hours": round(self.spot_s / 3600, 4),
            "on_demand_hours": round(self.on_demand_s / 3600, 4),
            "restarts": self.restarts,
            "preemptions": self.preemptions,
            "gap_to_optimal": None
            if self.gap_to_optimal is None
            else round(self.gap_to_optimal, 4),
        }
        if self.zone_switches is not None:
            view["zone_switches"] = self.zone_switches
        return view


_MARKET = {Decision.SPOT: Running.SPOT, Decision.ON_DEMAND: Running.ON_DEMAND}


def simulate(trace: SpotTrace, policy: SpotPolicy, scenario: Scenario) -> SimulationResult:
    """Run `policy` on `trace` from `scenario.start_tick` until the job is done or the trace
    ends. Raises ValueError if the start is outside the trace, RuntimeError if the policy asks
    for spot while there is none (a broken policy).
    """
    counts = trace.counts
    if scenario.start_tick >= len(counts):
        raise ValueError(f"start_tick {scenario.start_tick} is past the trace's end")
    gap, nodes, overhead = trace.gap_s, scenario.nodes, scenario.overhead_s
    job_s, deadline = scenario.job_s, scenario.deadline_s
    prices = scenario.prices
    elapsed = 0.0
    work_left = job_s
    overhead_left = 0.0
    running = Running.NOTHING
    state = PolicyState()
    spot_s = on_demand_s = 0.0
    restarts = preemptions = 0
    finish: float | None = None
    for tick in range(scenario.start_tick, len(counts)):
        spot_up = counts[tick] >= nodes
        if running is Running.SPOT and not spot_up:
            running = Running.NOTHING
            preemptions += 1
        inputs = PolicyInputs(
            work_left_s=work_left,
            time_left_s=deadline - elapsed,
            total_work_s=job_s,
            total_time_s=deadline,
            restart_overhead_s=overhead,
            spot_available=spot_up,
            running=running,
            spot_price=prices.spot,
            on_demand_price=prices.on_demand,
            decision_interval_s=gap,
            spent_usd=_usd(spot_s, prices.spot) + _usd(on_demand_s, prices.on_demand),
        )
        decision, state = policy.decide(inputs, state)
        if decision is Decision.WAIT:
            running = Running.NOTHING
            elapsed += gap
            continue
        if decision is Decision.SPOT and not spot_up:
            raise RuntimeError(f"policy {policy.name} chose spot at tick {tick}: none there")
        market = _MARKET[decision]
        if market is not running:
            running, overhead_left = market, overhead
            restarts += 1
        if market is Running.ON_DEMAND and state.committed_on_demand:
            # on-demand for good: the rest of the run needs no trace
            on_demand_s += overhead_left + work_left
            finish = elapsed + overhead_left + work_left
            break
        used = min(gap, overhead_left + work_left)
        progress = max(0.0, used - overhead_left)
        overhead_left = max(0.0, overhead_left - used)
        work_left -= progress
        if market is Running.SPOT:
            spot_s += used
        else:
            on_demand_s += used
        if work_left <= _DONE:
            finish = elapsed + used
            break
        elapsed += gap
    cost = (_usd(spot_s, prices.spot) + _usd(on_demand_s, prices.on_demand)) * nodes
    return SimulationResult(
        policy=policy.name,
        cost=cost.quantize(_CENT_FRACTION),
        finish_s=finish,
        met_deadline=finish is not None and finish <= deadline + _DONE,
        spot_s=spot_s,
        on_demand_s=on_demand_s,
        restarts=restarts,
        preemptions=preemptions,
    )


def _usd(seconds: float, price_per_hour: Decimal) -> Decimal:
    return Decimal(repr(round(seconds, 3))) * price_per_hour / Decimal(3600)
