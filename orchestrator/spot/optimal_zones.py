"""The offline optimum over zones: the cheapest schedule that meets the deadline when every
zone's trace is known, the floor of every zone-aware policy's cost (`gap_to_optimal`).

The dynamic programme of `orchestrator.spot.optimal` with a zone dimension. At each tick the
schedule waits, or runs on spot in a zone that has it, or on on-demand in any zone, with the
accounting of `orchestrator.spot.zones.simulate_zones`: a start in the checkpoint's zone (or
the first one) pays the restart overhead, a start in another zone the migration, and the
checkpoint moves to the zone of the start; the last tick is billed to the second the work
ends, and on-demand may be taken for good at any tick of the traces (the rest of the work in
one go, as the simulator runs a policy that commits to it).

States: `fresh` (never started), `idle` in zone z (the checkpoint there), and market m in
zone z, started by a restart or a migration, with j ticks run since the start (1..J, J the
start's overhead in ticks rounded up). Work done is kept on a grid of `tick / steps` seconds,
rounded down, as in `spot.optimal`; `grid_steps` cuts the grid so that both a restart's and a
migration's first tick of progress fall on it, and the optimum is then exact (to the float
rounding of the bill, far under a cent). Where that grid would be too fine, the cost is the one
of a schedule the grid finds, an upper bound within the grid's rounding. Unlike the single-zone
optimum the schedule is not replayed: the cost is the programme's own, quantized to a
hundredth of a cent. Needs numpy, imported when a solve runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

from orchestrator.spot.optimal import DEFAULT_STEPS_PER_TICK, MAX_EXACT_STEPS
from orchestrator.spot.zones import Zones, ZoneScenario

__all__ = ["grid_steps", "optimal_zones", "optimal_zones_costs"]

_EPS = 1e-6
_CENT_FRACTION = Decimal("0.0001")


def grid_steps(gap_s: float, *overheads_s: float) -> int:
    """Cells per tick that put every progress a tick can make on the grid: a whole tick, or a
    start's first tick past its overhead, for each overhead of `overheads_s`, to the
    millisecond; `DEFAULT_STEPS_PER_TICK` where that takes more than `MAX_EXACT_STEPS`."""
    gap_ms = round(gap_s * 1000)
    if gap_ms <= 0:
        return DEFAULT_STEPS_PER_TICK
    divisor = gap_ms
    for overhead in overheads_s:
        divisor = math.gcd(divisor, round(overhead * 1000) % gap_ms)
    steps = gap_ms // divisor
    return steps if steps <= MAX_EXACT_STEPS else DEFAULT_STEPS_PER_TICK


def optimal_zones(
    zones: Zones, job: ZoneScenario, *, steps_per_tick: int | None = None
) -> Decimal | None:
    """The cost (USD, all nodes) of the cheapest schedule over `zones` that meets
    `job.scenario.deadline_s`; None when no schedule can (the deadline is shorter than the
    job plus a restart)."""
    return optimal_zones_costs(zones, job, [job.scenario.deadline_s], steps_per_tick)[0]


def optimal_zones_costs(
    zones: Zones,
    job: ZoneScenario,
    deadlines_s: Sequence[float],
    steps_per_tick: int | None = None,
) -> list[Decimal | None]:
    """`optimal_zones` for the same job under each deadline of `deadlines_s` (the scenario's
    own is ignored), from one pass of the programme."""
    import numpy

    scenario = job.scenario
    gap = zones.gap_s
    overheads = (scenario.overhead_s, job.migration_s)  # kind 0: restart, 1: migration
    if steps_per_tick is None:
        steps_per_tick = grid_steps(gap, *overheads)
    if steps_per_tick < 1:
        raise ValueError("steps_per_tick must be >= 1")
    if scenario.start_tick >= len(zones):
        raise ValueError(f"start_tick {scenario.start_tick} is past the traces' end")
    prices = [float(price) for price in job.prices_for(zones.size)]
    od_price = float(scenario.prices.on_demand)
    job_s, unit = scenario.job_s, gap / steps_per_tick
    cells = max(1, math.ceil(job_s / unit - _EPS))
    done = numpy.arange(cells) * unit
    ticks = [max(1, math.ceil(o / gap - _EPS)) for o in overheads]  # J per kind
    left = [
        [max(0.0, o - j * gap) for j in range(n + 1)] for o, n in zip(overheads, ticks, strict=True)
    ]
    progress = [[max(0.0, gap - x) for x in row] for row in left]
    shifts = [[int(p / unit + _EPS) for p in row] for row in progress]
    firsts = [[int(numpy.searchsorted(done, job_s - p - _EPS)) for p in row] for row in progress]
    n_zones = zones.size
    # state layout: 0 fresh, 1..Z idle in z, then (market, zone, kind, j) blocks
    index: dict[tuple[int, int, int, int], int] = {}
    for market in (0, 1):  # 0 spot, 1 on-demand
        for zone in range(n_zones):
            for kind in (0, 1):
                for j in range(1, ticks[kind] + 1):
                    index[market, zone, kind, j] = 1 + n_zones + len(index)
    states = 1 + n_zones + len(index)
    at_zone = [
        [1 + zone] + [s for (_, z, _, _), s in index.items() if z == zone]
        for zone in range(n_zones)
    ]
    of_market = {
        (market, zone): [s for (m, z, _, _), s in index.items() if (m, z) == (market, zone)]
        for market in (0, 1)
        for zone in range(n_zones)
    }
    deadlines = sorted(set(deadlines_s))
    best = dict.fromkeys(deadlines, math.inf)
    cost = numpy.full((states, cells), numpy.inf)
    cost[0, 0] = 0.0
    horizon = math.ceil(max(deadlines) / gap - _EPS)
    end = min(len(zones), scenario.start_tick + horizon)
    for step, tick in enumerate(range(scenario.start_tick, end)):
        elapsed = step * gap
        open_deadlines = [d for d in deadlines if d > elapsed + _EPS]
        if not open_deadlines:
            break
        reach = min(cells, step * steps_per_tick + 1)  # no cell above is reached by now
        new = numpy.full((states, cells), numpy.inf)
        new[0] = cost[0]
        located = [cost[rows].min(axis=0) for rows in at_zone]
        for zone in range(n_zones):
            new[1 + zone] = located[zone]
        for market in (0, 1):
            for zone in range(n_zones):
                if market == 0 and zones.counts[zone][tick] < scenario.nodes:
                    continue
                price = prices[zone] if market == 0 else od_price
                mine = of_market[market, zone]
                others = [s for s in at_zone[zone] if s not in mine]
                restart = numpy.minimum(cost[0], cost[others].min(axis=0))
                away = [located[z] for z in range(n_zones) if z != zone]
                sources = [(restart, 0, 0)]
                if away:
                    sources.append((numpy.minimum.reduce(away), 1, 0))
                sources += [
                    (cost[index[market, zone, kind, j]], kind, j)
                    for kind in (0, 1)
                    for j in range(1, ticks[kind] + 1)
                ]
                for values, kind, ran in sources:
                    first = firsts[kind][ran]
                    ends = 0 if market == 1 else first
                    if ends < reach:
                        used = left[kind][ran] + (job_s - done[ends:reach])
                        total = values[ends:reach] + used * price
                        # finish times fall with the cell: the cells from `lo` make a deadline
                        cheapest = numpy.minimum.accumulate(total[::-1])[::-1]
                        late = -(elapsed + used)
                        for deadline in open_deadlines:
                            lo = int(numpy.searchsorted(late, -(deadline + _EPS)))
                            if lo < len(total) and cheapest[lo] < best[deadline]:
                                best[deadline] = float(cheapest[lo])
                    first = min(first, reach)
                    if first <= 0:
                        continue
                    target = index[market, zone, kind, min(ran + 1, ticks[kind])]
                    shift = shifts[kind][ran]
                    inside = max(0, min(first, cells - shift))
                    if inside:
                        landing = new[target, shift : shift + inside]
                        numpy.minimum(landing, values[:inside] + gap * price, out=landing)
                    if inside < first:  # rounding's edge: kept in the last cell
                        tail = new[target, cells - 1 :]
                        numpy.minimum(tail, values[inside:first].min() + gap * price, out=tail)
        cost = new
    results: list[Decimal | None] = []
    for deadline in deadlines_s:
        value = best[deadline]
        if math.isinf(value):
            if scenario.overhead_s + job_s > deadline + _EPS:
                results.append(None)
                continue
            value = (scenario.overhead_s + job_s) * od_price  # the grid lost a tight deadline
        dollars = Decimal(repr(value)) / Decimal(3600) * scenario.nodes
        results.append(dollars.quantize(_CENT_FRACTION))
    return results
