"""Several availability zones: one job, one spot availability trace per zone, and the moves
between zones that a zone-aware policy makes.

The model extends the single-zone one (`orchestrator.spot.simulate`):

- The zones' traces cover the same span of time: `Zones.from_traces` puts them on one clock
  (the finest tick of them, each zone holding its value through its own tick) and cuts them
  to the shortest.
- At each tick the policy picks a market (spot, on-demand, wait) and a zone. Spot in a zone
  needs that zone's trace to have the job's nodes during the tick; on-demand can be had in any
  zone, at one price.
- The job's checkpoint is where it last ran. A start in that zone (or the very first start)
  pays the restart overhead; a start in another zone pays the migration instead (a restart
  plus moving the checkpoint), and the checkpoint moves with it. Stopping costs nothing.
- Spot may cost a different price in each zone; cost = instance-seconds x the market's price
  in the zone x nodes, as in the single-zone simulator.

`MultiZonePolicy` turns any single-zone policy into a zone-aware one; `uniform-progress-mz`
is Uniform Progress over the zones. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Protocol, TypeVar

from orchestrator.errors import SpecError, TraceError
from orchestrator.providers.traces import SpotTrace
from orchestrator.spot.policies import (
    Decision,
    OnDemandPolicy,
    PolicyInputs,
    PolicyState,
    Running,
    SpotPolicy,
    get_policy,
)
from orchestrator.spot.simulate import Scenario, SimulationResult, _usd

__all__ = [
    "ZONE_POLICY_NAMES",
    "MultiZonePolicy",
    "ZoneInputs",
    "ZonePolicy",
    "ZoneScenario",
    "Zones",
    "get_zone_policy",
    "simulate_zones",
    "with_zone_gap",
]

_DONE = 1e-6  # as in simulate.py: seconds of work left that count as none
_CENT_FRACTION = Decimal("0.0001")  # as in simulate.py
_EPS = 1e-9
_R = TypeVar("_R", bound=SimulationResult)


@dataclass(frozen=True)
class Zones:
    """The availability of spot in each zone, tick by tick, on one clock."""

    names: tuple[str, ...]  # one per zone (the traces' names)
    gap_s: float  # seconds per tick (> 0)
    counts: tuple[tuple[int, ...], ...]  # per zone: spot instances obtainable per tick

    def __post_init__(self) -> None:
        if not self.counts or len(self.names) != len(self.counts):
            raise ValueError("one name per zone, and at least one zone")
        if len({len(counts) for counts in self.counts}) != 1 or not self.counts[0]:
            raise ValueError("every zone needs the same number of ticks, at least one")
        if not self.gap_s > 0:
            raise ValueError("gap_s must be > 0")

    def __len__(self) -> int:
        return len(self.counts[0])

    @property
    def size(self) -> int:
        """How many zones."""
        return len(self.counts)

    def trace(self, zone: int) -> SpotTrace:
        """Zone `zone` alone, on the common clock: what a single-zone policy would run on."""
        return SpotTrace(name=self.names[zone], gap_s=self.gap_s, counts=self.counts[zone])

    @classmethod
    def from_traces(cls, traces: Sequence[SpotTrace]) -> Zones:
        """The traces as zones over one span of time: ticks of the finest gap among them, each
        trace's value held through its own tick (tick i of the result reads the tick of each
        trace that covers time i x gap), cut to the shortest trace. TraceError when there
        are no traces or the shortest covers less than one tick."""
        if not traces:
            raise TraceError("no trace given for the zones")
        gap = min(trace.gap_s for trace in traces)
        ticks = min(math.floor(trace.duration_s / gap + _EPS) for trace in traces)
        if ticks < 1:
            raise TraceError("the shortest trace covers less than one tick of the others")
        counts = tuple(
            tuple(trace.counts[min(len(trace) - 1, int(i * gap / trace.gap_s + _EPS))]
                  for i in range(ticks))
            for trace in traces
        )  # fmt: skip
        return cls(names=tuple(trace.name for trace in traces), gap_s=gap, counts=counts)


@dataclass(frozen=True)
class ZoneScenario:
    """One job to simulate over zones: the single-zone scenario (job, deadline, restart
    overhead, prices, nodes, start tick), the migration and the spot price of each zone."""

    scenario: Scenario
    migration_s: float  # paid instead of `overhead_s` by a start outside the checkpoint's zone
    spot_prices: tuple[Decimal, ...] = ()  # USD per node-hour, per zone; () = all
    # `scenario.prices.spot`

    def __post_init__(self) -> None:
        if not math.isfinite(self.migration_s) or self.migration_s < 0:
            raise ValueError("migration_s must be a finite number of seconds >= 0")
        if any(not price > 0 for price in self.spot_prices):
            raise ValueError("spot prices must be > 0")

    def prices_for(self, zones: int) -> tuple[Decimal, ...]:
        """The spot price of each of `zones` zones. ValueError when a price per zone was given
        for another number of zones."""
        if not self.spot_prices:
            return (self.scenario.prices.spot,) * zones
        if len(self.spot_prices) != zones:
            raise ValueError(f"{len(self.spot_prices)} spot prices for {zones} zones")
        return self.spot_prices

    def start_s(self, checkpoint: int | None, zone: int) -> float:
        """What a start in `zone` costs, in seconds, with the checkpoint in `checkpoint`
        (None: the job has not run yet)."""
        if checkpoint is None or checkpoint == zone:
            return self.scenario.overhead_s
        return self.migration_s


@dataclass(frozen=True, slots=True)
class ZoneInputs:
    """Everything a zone-aware policy sees at one decision point. Durations in seconds, prices
    in USD per node-hour."""

    work_left_s: float
    time_left_s: float
    total_work_s: float
    total_time_s: float
    overhead_s: float  # a start in the checkpoint's zone
    migration_s: float  # a start in another zone
    spot: tuple[bool, ...]  # per zone: spot for all the job's nodes can be had now
    spot_prices: tuple[Decimal, ...]  # per zone
    on_demand_price: Decimal
    running: Running  # SPOT only while the instance is alive (not reclaimed)
    checkpoint: int | None  # the zone the job last ran in; None before its first start
    decision_interval_s: float = 0.0
    spent_usd: Decimal | None = None  # billed so far, per node

    def start_s(self, zone: int) -> float:
        """What a start in `zone` costs, in seconds."""
        if self.checkpoint is None or self.checkpoint == zone:
            return self.overhead_s
        return self.migration_s

    def spot_zone(self) -> int | None:
        """Where spot would run: the checkpoint's zone while it has spot (a move costs the
        migration), otherwise the cheapest zone with spot (the first of equal ones); None when
        no zone has spot cheaper than on-demand (spot that is not cheaper is never taken)."""
        paying = [
            zone
            for zone, up in enumerate(self.spot)
            if up and self.spot_prices[zone] < self.on_demand_price
        ]
        if self.checkpoint in paying:
            return self.checkpoint
        if not paying:
            return None
        return min(paying, key=lambda zone: (self.spot_prices[zone], zone))

    def home(self) -> int:
        """Where on-demand runs: the checkpoint's zone, or the cheapest zone before the first
        start (on-demand costs the same everywhere)."""
        if self.checkpoint is not None:
            return self.checkpoint
        return min(range(len(self.spot)), key=lambda zone: (self.spot_prices[zone], zone))

    def view(self, zone: int | None) -> PolicyInputs:
        """What a single-zone policy sees when spot means spot in `zone` (None: no spot).

        The restart it plans with is the dearer of a start in `zone` and an on-demand restart
        where the job would then be: the safety net keeps room for both (the spot instance may
        be taken back as soon as it is up), and the savings rule pays for the move. Without a
        zone the spot price is the cheapest zone's: the price the next spot start may pay."""
        start = self.overhead_s if zone is None else max(self.overhead_s, self.start_s(zone))
        return PolicyInputs(
            work_left_s=self.work_left_s,
            time_left_s=self.time_left_s,
            total_work_s=self.total_work_s,
            total_time_s=self.total_time_s,
            restart_overhead_s=start,
            spot_available=zone is not None and self.spot[zone],
            running=self.running,
            spot_price=min(self.spot_prices) if zone is None else self.spot_prices[zone],
            on_demand_price=self.on_demand_price,
            decision_interval_s=self.decision_interval_s,
            spent_usd=self.spent_usd,
        )


class ZonePolicy(Protocol):
    """A decision rule over zones: `decide` is pure, as `SpotPolicy.decide` is, and answers the
    market and the zone to run it in (the zone means nothing for WAIT). Never SPOT in a zone
    without spot."""

    name: str

    def decide(
        self, inputs: ZoneInputs, state: PolicyState
    ) -> tuple[Decision, int, PolicyState]: ...


@dataclass(frozen=True)
class MultiZonePolicy:
    """A single-zone policy run over zones: spot goes to `ZoneInputs.spot_zone` (stay while the
    checkpoint's zone has spot, else the cheapest zone with spot), on-demand to the
    checkpoint's zone, and every rule of the base policy, its safety net and savings rule
    included, decides on the view of that zone (`ZoneInputs.view`).

    A move to another zone is checked with the migration as its restart. When that check
    alone would send the job to on-demand for good (the safety net or the savings cannot
    afford a migration, but could a restart where the job is), the move is not made and the
    base policy decides as if no zone had spot: it waits or runs on-demand where it is,
    committing only if it would without the move. Hence the deadline guarantee of the base
    policy carries over with the dearer restart: a job whose deadline all on-demand would meet
    meets it."""

    base: SpotPolicy
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", f"{self.base.name}-mz")

    def decide(self, inputs: ZoneInputs, state: PolicyState) -> tuple[Decision, int, PolicyState]:
        home = inputs.home()
        target = inputs.spot_zone()
        if target is None:
            decision, new_state = self.base.decide(inputs.view(None), state)
            return decision, home, new_state
        decision, new_state = self.base.decide(inputs.view(target), state)
        moving = inputs.checkpoint is not None and target != inputs.checkpoint
        if (
            moving
            and decision is Decision.ON_DEMAND
            and new_state.committed_on_demand
            and not state.committed_on_demand
        ):
            staying, stay_state = self.base.decide(inputs.view(None), state)
            if not stay_state.committed_on_demand:
                return staying, home, stay_state
        return decision, (target if decision is Decision.SPOT else home), new_state


_ZONE_POLICIES: dict[str, ZonePolicy] = {
    policy.name: policy
    for policy in (
        MultiZonePolicy(get_policy("uniform-progress")),
        MultiZonePolicy(get_policy("greedy")),
        MultiZonePolicy(OnDemandPolicy()),
        MultiZonePolicy(get_policy("spot-only")),
    )
}

ZONE_POLICY_NAMES: tuple[str, ...] = tuple(_ZONE_POLICIES)
"""Every zone-aware policy: uniform-progress-mz, greedy-mz, on-demand-mz, spot-only-mz."""


def get_zone_policy(name: str) -> ZonePolicy:
    """The zone-aware policy called `name`; SpecError (exit 2) naming the known ones."""
    try:
        return _ZONE_POLICIES[name]
    except KeyError:
        raise SpecError(
            f"unknown multi-zone spot policy {name!r}",
            hint=f"use one of: {', '.join(ZONE_POLICY_NAMES)}",
        ) from None


_MARKET = {Decision.SPOT: Running.SPOT, Decision.ON_DEMAND: Running.ON_DEMAND}


def simulate_zones(zones: Zones, policy: ZonePolicy, job: ZoneScenario) -> SimulationResult:
    """Run `policy` over `zones` from `job.scenario.start_tick` until the job is done or the
    traces end, with the accounting of `orchestrator.spot.simulate` and the zones' model
    (module docstring). Raises ValueError if the start is outside the traces or the prices do
    not fit the zones, RuntimeError if the policy asks for spot in a zone without any."""
    scenario = job.scenario
    if scenario.start_tick >= len(zones):
        raise ValueError(f"start_tick {scenario.start_tick} is past the traces' end")
    prices = job.prices_for(zones.size)
    od_price = scenario.prices.on_demand
    gap, nodes = zones.gap_s, scenario.nodes
    job_s, deadline = scenario.job_s, scenario.deadline_s
    elapsed, work_left, overhead_left = 0.0, job_s, 0.0
    running, running_zone = Running.NOTHING, 0
    checkpoint: int | None = None
    state = PolicyState()
    spot_s = [0.0] * zones.size
    on_demand_s = 0.0
    restarts = preemptions = switches = 0
    finish: float | None = None
    for tick in range(scenario.start_tick, len(zones)):
        spot = tuple(counts[tick] >= nodes for counts in zones.counts)
        if running is Running.SPOT and not spot[running_zone]:
            running = Running.NOTHING
            preemptions += 1
        inputs = ZoneInputs(
            work_left_s=work_left,
            time_left_s=deadline - elapsed,
            total_work_s=job_s,
            total_time_s=deadline,
            overhead_s=scenario.overhead_s,
            migration_s=job.migration_s,
            spot=spot,
            spot_prices=prices,
            on_demand_price=od_price,
            running=running,
            checkpoint=checkpoint,
            decision_interval_s=gap,
            spent_usd=_bill(spot_s, prices, on_demand_s, od_price),
        )
        decision, zone, state = policy.decide(inputs, state)
        if decision is Decision.WAIT:
            running = Running.NOTHING
            elapsed += gap
            continue
        if not 0 <= zone < zones.size:
            raise RuntimeError(f"policy {policy.name} chose zone {zone} of {zones.size}")
        if decision is Decision.SPOT and not spot[zone]:
            raise RuntimeError(
                f"policy {policy.name} chose spot in zone {zone} at tick {tick}: none there"
            )
        market = _MARKET[decision]
        if market is not running or zone != running_zone:
            overhead_left = job.start_s(checkpoint, zone)
            switches += checkpoint is not None and checkpoint != zone
            running, running_zone, checkpoint = market, zone, zone
            restarts += 1
        if market is Running.ON_DEMAND and state.committed_on_demand:
            on_demand_s += overhead_left + work_left
            finish = elapsed + overhead_left + work_left
            break
        used = min(gap, overhead_left + work_left)
        progress = max(0.0, used - overhead_left)
        overhead_left = max(0.0, overhead_left - used)
        work_left -= progress
        if market is Running.SPOT:
            spot_s[zone] += used
        else:
            on_demand_s += used
        if work_left <= _DONE:
            finish = elapsed + used
            break
        elapsed += gap
    cost = _bill(spot_s, prices, on_demand_s, od_price) * nodes
    return SimulationResult(
        policy=policy.name,
        cost=cost.quantize(_CENT_FRACTION),
        finish_s=finish,
        met_deadline=finish is not None and finish <= deadline + _DONE,
        spot_s=sum(spot_s),
        on_demand_s=on_demand_s,
        restarts=restarts,
        preemptions=preemptions,
        zone_switches=switches,
    )


def with_zone_gap(result: _R, optimum: Decimal | None) -> _R:
    """`result` (a multi-zone run, or a single-zone one in one of the zones) with its
    `gap_to_optimal` against the multi-zone optimum's cost (None when there is none, or it
    is 0)."""
    if optimum is None or optimum <= 0:
        return replace(result, gap_to_optimal=None)
    return replace(result, gap_to_optimal=float(result.cost / optimum) - 1)


def _bill(
    spot_s: Sequence[float], prices: Sequence[Decimal], on_demand_s: float, od_price: Decimal
) -> Decimal:
    total = sum((_usd(s, p) for s, p in zip(spot_s, prices, strict=True)), Decimal(0))
    return total + _usd(on_demand_s, od_price)
