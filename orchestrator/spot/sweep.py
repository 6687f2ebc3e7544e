"""Sweep the simulator over deadline slack: every policy, job length and slack on each trace.

A cell of the sweep is (trace, job length, slack, policy): the job is simulated from `starts`
submit times spread evenly over the trace (the same ones for every cell of a trace), and the
cell keeps the mean cost, how many runs met the deadline and the mean gap to the offline
optimum (`orchestrator.spot.optimal`, which may be swept as the policy `optimal` too). Slack
is the deadline's margin over the job: a 10 h job with 30 % slack must be done 13 h after it
is submitted. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from orchestrator.errors import TraceError
from orchestrator.providers.traces import SpotTrace
from orchestrator.spot.optimal import OPTIMAL, optimal_schedules, with_gap
from orchestrator.spot.policies import SpotPolicy, get_policy
from orchestrator.spot.simulate import Prices, Scenario, SimulationResult, simulate

__all__ = [
    "DEFAULT_STARTS",
    "SLACKS_PCT",
    "SweepCell",
    "mean_costs",
    "mean_gaps",
    "start_ticks",
    "sweep",
]

SLACKS_PCT: tuple[int, ...] = tuple(range(10, 101, 10))
"""Deadline slack swept by default, in percent of the job's length: 10 % to 100 %."""

DEFAULT_STARTS = 16
"""Submit times per trace: enough to average over the trace's good and bad stretches."""


@dataclass(frozen=True)
class SweepCell:
    """One policy on one (trace, job length, slack), over all the trace's start times."""

    trace: str
    spot_fraction: float  # share of the trace's ticks with spot for the job's nodes
    job_hours: float
    slack_pct: int
    policy: str
    runs: int
    mean_cost: Decimal  # USD
    max_cost: Decimal  # USD, the most expensive run
    met: int  # runs that finished by the deadline
    mean_gap: float | None = None  # mean of cost / optimal - 1 over the runs that have an
    # optimum (None: none has)

    @property
    def deadline_hours(self) -> float:
        return self.job_hours * (1 + self.slack_pct / 100)


def start_ticks(trace: SpotTrace, window_s: float, count: int) -> list[int]:
    """`count` submit ticks spread evenly over the trace, each leaving `window_s` of trace
    after it. TraceError when the trace is shorter than the window."""
    room = len(trace) - math.ceil(window_s / trace.gap_s)
    if room < 0:
        raise TraceError(
            f"{trace.name} covers {trace.duration_s / 3600:.1f} h, less than the longest "
            f"deadline swept ({window_s / 3600:.1f} h)",
            hint="use a longer trace, shorter jobs or less slack",
        )
    if count <= 1:
        return [0]
    return sorted({round(i * room / (count - 1)) for i in range(count)})


def sweep(
    traces: Iterable[SpotTrace],
    *,
    job_hours: Sequence[float],
    policies: Sequence[str],
    overhead_s: float,
    prices: Prices,
    slacks_pct: Sequence[int] = SLACKS_PCT,
    starts: int = DEFAULT_STARTS,
    nodes: int = 1,
    gaps: bool = True,
) -> list[SweepCell]:
    """Simulate every (trace, job length, slack, policy); cells in that order. The policy
    `optimal` is the offline optimum; every cell's `mean_gap` is measured against it. Without
    `gaps` (and without `optimal` among the policies) no optimum is computed, which takes most
    of a sweep's time, and every `mean_gap` is None."""
    if not gaps and OPTIMAL in policies:
        raise ValueError("the policy 'optimal' needs gaps=True")
    chosen = [name if name == OPTIMAL else get_policy(name) for name in policies]
    cells: list[SweepCell] = []
    for trace in traces:
        window = max(job_hours) * 3600 * (1 + max(slacks_pct) / 100)
        ticks = start_ticks(trace, window, starts)
        fraction = trace.spot_fraction(nodes)
        for hours in job_hours:
            deadlines = [hours * 3600 * (1 + slack / 100) for slack in slacks_pct]
            scenarios = [
                Scenario(
                    job_s=hours * 3600,
                    deadline_s=max(deadlines),
                    overhead_s=overhead_s,
                    prices=prices,
                    nodes=nodes,
                    start_tick=tick,
                )  # fmt: skip
                for tick in ticks
            ]
            optima = [
                optimal_schedules(trace, scenario, deadlines) if gaps else [None] * len(deadlines)
                for scenario in scenarios
            ]
            for column, (slack, deadline) in enumerate(zip(slacks_pct, deadlines, strict=True)):
                best = [by_deadline[column] for by_deadline in optima]
                for policy in chosen:
                    results = [
                        _run(trace, policy, replace(scenario, deadline_s=deadline), optimum)
                        for scenario, optimum in zip(scenarios, best, strict=True)
                    ]
                    cells.append(_cell(trace.name, fraction, hours, slack, results))
    return cells


def _run(
    trace: SpotTrace,
    policy: SpotPolicy | str,
    scenario: Scenario,
    optimum: SimulationResult | None,
) -> SimulationResult:
    if isinstance(policy, str):  # the optimum itself
        if optimum is not None:
            return optimum
        on_demand = simulate(trace, get_policy("on-demand"), scenario)
        return replace(on_demand, policy=OPTIMAL, gap_to_optimal=None)
    return with_gap(simulate(trace, policy, scenario), optimum)


def _cell(
    trace: str, fraction: float, hours: float, slack: int, results: list[SimulationResult]
) -> SweepCell:
    costs = [result.cost for result in results]
    gaps = [result.gap_to_optimal for result in results if result.gap_to_optimal is not None]
    return SweepCell(
        trace=trace,
        spot_fraction=fraction,
        job_hours=hours,
        slack_pct=slack,
        policy=results[0].policy,
        runs=len(results),
        mean_cost=(sum(costs, Decimal(0)) / len(costs)).quantize(Decimal("0.0001")),
        max_cost=max(costs),
        met=sum(result.met_deadline for result in results),
        mean_gap=sum(gaps) / len(gaps) if gaps else None,
    )


def mean_gaps(cells: Iterable[SweepCell]) -> dict[str, dict[str, float | None]]:
    """trace -> policy -> mean of the cells' `mean_gap` (None where no cell has one)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for cell in cells:
        gaps = sums.setdefault(cell.trace, {}).setdefault(cell.policy, [])
        if cell.mean_gap is not None:
            gaps.append(cell.mean_gap)
    return {
        trace: {policy: sum(g) / len(g) if g else None for policy, g in by_policy.items()}
        for trace, by_policy in sums.items()
    }


def mean_costs(cells: Iterable[SweepCell]) -> dict[str, dict[str, Decimal]]:
    """trace -> policy -> mean cost over all the trace's cells (every job length and slack)."""
    sums: dict[str, dict[str, list[Decimal]]] = {}
    for cell in cells:
        sums.setdefault(cell.trace, {}).setdefault(cell.policy, []).append(cell.mean_cost)
    return {
        trace: {
            policy: (sum(values, Decimal(0)) / len(values)).quantize(Decimal("0.0001"))
            for policy, values in by_policy.items()
        }
        for trace, by_policy in sums.items()
    }
