"""Sweep a zone-aware policy over deadline slack, against the same policy kept in one zone.

For each job length and slack, the job is simulated from `starts` submit times spread evenly
over the zones' common span (`orchestrator.spot.sweep.start_ticks`): once with the multi-zone
policy (`<policy>-mz`) over all the zones, once with the single-zone policy in each zone alone
(at that zone's spot price, the plain restart overhead), and, with `gaps`, the multi-zone
optimum (`orchestrator.spot.optimal_zones`), the floor of all of them: every gap is measured
against it. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from orchestrator.spot.optimal import OPTIMAL
from orchestrator.spot.optimal_zones import optimal_zones_costs
from orchestrator.spot.policies import get_policy
from orchestrator.spot.simulate import Prices, Scenario, SimulationResult, simulate
from orchestrator.spot.sweep import DEFAULT_STARTS, SLACKS_PCT, start_ticks
from orchestrator.spot.zones import (
    Zones,
    ZoneScenario,
    get_zone_policy,
    simulate_zones,
    with_zone_gap,
)

__all__ = ["ALL_ZONES", "ZoneSweepCell", "best_zone", "mean_cost", "zone_sweep"]

ALL_ZONES = "all zones"
"""The `zone` of a multi-zone policy's cells (and of the optimum's)."""

_QUANTUM = Decimal("0.0001")


@dataclass(frozen=True)
class ZoneSweepCell:
    """One policy on one (job length, slack), over all the start times."""

    job_hours: float
    slack_pct: int
    policy: str  # `<name>-mz`, the single-zone `<name>`, or `optimal` (over all zones)
    zone: str  # the zone's name, or `ALL_ZONES`
    runs: int
    mean_cost: Decimal  # USD
    met: int  # runs that finished by the deadline
    mean_gap: float | None  # mean of cost / multi-zone optimum - 1 (None: no optimum)
    mean_switches: float  # moves between zones per run (0 in one zone)

    @property
    def deadline_hours(self) -> float:
        return self.job_hours * (1 + self.slack_pct / 100)


def zone_sweep(
    zones: Zones,
    *,
    job_hours: Sequence[float],
    overhead_s: float,
    migration_s: float,
    prices: Prices,
    spot_prices: Sequence[Decimal] = (),
    policies: Sequence[str] = ("uniform-progress",),
    slacks_pct: Sequence[int] = SLACKS_PCT,
    starts: int = DEFAULT_STARTS,
    nodes: int = 1,
    gaps: bool = True,
) -> list[ZoneSweepCell]:
    """Cells per (job length, slack): for each single-zone policy name of `policies`, its
    multi-zone form, then the policy in each zone; last the optimum (with `gaps`). TraceError
    when the zones are shorter than the longest deadline; SpecError for an unknown policy;
    ValueError when `spot_prices` is neither empty nor one positive price per zone."""
    zone_prices = tuple(spot_prices) or (prices.spot,) * zones.size
    if len(zone_prices) != zones.size or any(not price > 0 for price in zone_prices):
        raise ValueError(f"give {zones.size} spot prices > 0, one per zone, or none")
    for name in policies:
        get_policy(name)
        get_zone_policy(f"{name}-mz")
    cells: list[ZoneSweepCell] = []
    for hours in job_hours:
        deadlines = [hours * 3600 * (1 + slack / 100) for slack in slacks_pct]
        ticks = start_ticks(zones.trace(0), max(deadlines), starts)
        jobs = [
            ZoneScenario(
                Scenario(
                    job_s=hours * 3600,
                    deadline_s=max(deadlines),
                    overhead_s=overhead_s,
                    prices=prices,
                    nodes=nodes,
                    start_tick=tick,
                ),
                migration_s,
                tuple(zone_prices),
            )  # fmt: skip
            for tick in ticks
        ]
        optima = [
            optimal_zones_costs(zones, job, deadlines) if gaps else [None] * len(deadlines)
            for job in jobs
        ]
        for column, (slack, deadline) in enumerate(zip(slacks_pct, deadlines, strict=True)):
            best = [by_deadline[column] for by_deadline in optima]
            timed = [
                replace(job, scenario=replace(job.scenario, deadline_s=deadline)) for job in jobs
            ]
            for name in policies:
                multi = get_zone_policy(f"{name}-mz")
                results: list[SimulationResult] = [
                    with_zone_gap(simulate_zones(zones, multi, job), optimum)
                    for job, optimum in zip(timed, best, strict=True)
                ]
                cells.append(_cell(hours, slack, multi.name, ALL_ZONES, results))
                for zone in range(zones.size):
                    single = get_policy(name)
                    zone_results = [
                        with_zone_gap(
                            simulate(
                                zones.trace(zone),
                                single,
                                replace(
                                    job.scenario, prices=replace(prices, spot=zone_prices[zone])
                                ),
                            ),
                            optimum,
                        )  # fmt: skip
                        for job, optimum in zip(timed, best, strict=True)
                    ]
                    cells.append(_cell(hours, slack, name, zones.names[zone], zone_results))
            if gaps:
                optimum_costs = [cost for cost in best if cost is not None]
                cells.append(
                    ZoneSweepCell(
                        job_hours=hours, slack_pct=slack, policy=OPTIMAL, zone=ALL_ZONES,
                        runs=len(optimum_costs), mean_cost=_mean(optimum_costs),
                        met=len(optimum_costs), mean_gap=0.0 if optimum_costs else None,
                        mean_switches=0.0,
                    )
                )  # fmt: skip
    return cells


def _mean(values: Sequence[Decimal]) -> Decimal:
    if not values:
        return Decimal(0)
    return (sum(values, Decimal(0)) / len(values)).quantize(_QUANTUM)


def _cell(
    hours: float, slack: int, policy: str, zone: str, results: Sequence[SimulationResult]
) -> ZoneSweepCell:
    gaps = [r.gap_to_optimal for r in results if r.gap_to_optimal is not None]
    switches = [r.zone_switches or 0 for r in results]
    return ZoneSweepCell(
        job_hours=hours,
        slack_pct=slack,
        policy=policy,
        zone=zone,
        runs=len(results),
        mean_cost=_mean([r.cost for r in results]),
        met=sum(r.met_deadline for r in results),
        mean_gap=sum(gaps) / len(gaps) if gaps else None,
        mean_switches=sum(switches) / len(switches),
    )


def mean_cost(
    cells: Sequence[ZoneSweepCell], policy: str, zone: str, job_hours: float | None = None
) -> Decimal:
    """Mean of the cells' mean cost for `policy` in `zone` (of one job length, or all)."""
    chosen = [
        c.mean_cost
        for c in cells
        if c.policy == policy and c.zone == zone and job_hours in (None, c.job_hours)
    ]
    return _mean(chosen)


def best_zone(
    cells: Sequence[ZoneSweepCell], policy: str, job_hours: float | None = None
) -> tuple[str, Decimal]:
    """The zone where single-zone `policy` has the lowest mean cost (of one job length, or
    over all the cells), and that cost. ValueError when `policy` has no single-zone cell."""
    zones = list(dict.fromkeys(c.zone for c in cells if c.policy == policy and c.zone != ALL_ZONES))
    if not zones:
        raise ValueError(f"no single-zone cell of {policy!r}")
    costs = {zone: mean_cost(cells, policy, zone, job_hours) for zone in zones}
    zone = min(zones, key=lambda z: costs[z])
    return zone, costs[zone]
