"""The offline optimum: the cheapest schedule that meets the deadline when the whole trace is
known, the bound every policy's cost is measured against (`gap_to_optimal`).

At each tick the schedule runs on spot (only while the trace has it for the job's nodes), on
on-demand, or waits, with the simulator's accounting (`orchestrator.spot.simulate`): a start on
a new instance (the first one, a move between markets, a restart after a reclaim or a wait)
pays `overhead_s` without progress, billed; a tick's decision holds for the whole tick; the last
tick is billed to the second the work ends. On-demand may also be taken for good at any tick of
the trace: the rest of the work then runs there in one go, as the simulator runs a policy that
commits to it (the only way a job goes on past the trace's end).

Dynamic programming over ticks x work done x what the job runs on: `none`, or market m with
j ticks run since its start (1..J, J = ceil(overhead / tick): after J ticks the restart is
paid and a tick brings a whole tick of progress). Work done is kept on a grid of
`tick / steps_per_tick` seconds, rounded down, so every schedule the grid finds is one the
simulator can run (it makes at least the progress the grid counts). The only progress that is
not a whole tick is a start's first tick past its restart; by default the grid is cut so that
it falls on the grid too (`grid_steps`), and the optimum is then exact. The schedule is then
replayed through `simulate`, and its cost there is the optimum reported: the same accounting
as every other policy, to the cent. A grid twice as fine changes the cost by far less than
0.5 % on the repository's traces (the tests check it). Needs numpy (matplotlib's dependency),
imported when a solve runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from orchestrator.providers.traces import SpotTrace
from orchestrator.spot.policies import Decision, PolicyInputs, PolicyState
from orchestrator.spot.simulate import Scenario, SimulationResult, simulate

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_STEPS_PER_TICK",
    "MAX_EXACT_STEPS",
    "OPTIMAL",
    "ReplayPolicy",
    "grid_steps",
    "optimal",
    "optimal_schedules",
    "with_gap",
]

OPTIMAL = "optimal"
"""The name the optimum goes by in `orch simulate` and the sweep (not a policy a job can use)."""

DEFAULT_STEPS_PER_TICK = 4
"""Grid cells of work per tick where no exact grid is small enough (see `grid_steps`); 8
changes no cost on the repository's traces by 0.5 %."""

MAX_EXACT_STEPS = 300
"""The finest grid `grid_steps` cuts (cells per tick) to make the optimum exact."""

_EPS = 1e-6


@dataclass(frozen=True)
class ReplayPolicy:
    """Plays a schedule worked out in advance: `decisions[i]` at the i-th tick after the start.

    From the point where only on-demand is left, it commits to on-demand, so the simulator
    finishes the job past the trace's end as it does for the other policies."""

    decisions: tuple[Decision, ...]
    name: str = OPTIMAL

    def decide(self, inputs: PolicyInputs, state: PolicyState) -> tuple[Decision, PolicyState]:
        if inputs.work_left_s <= 0:
            return Decision.WAIT, state
        interval = inputs.decision_interval_s
        index = round(inputs.elapsed_s / interval) if interval > 0 else 0
        rest = self.decisions[index:] or (Decision.ON_DEMAND,)
        if all(decision is Decision.ON_DEMAND for decision in rest):
            return Decision.ON_DEMAND, replace(state, committed_on_demand=True)
        return rest[0], state


def with_gap(result: SimulationResult, optimum: SimulationResult | None) -> SimulationResult:
    """`result` with its `gap_to_optimal` (None when there is no optimum, or it costs 0)."""
    if optimum is None or optimum.cost <= 0:
        return replace(result, gap_to_optimal=None)
    return replace(result, gap_to_optimal=float(result.cost / optimum.cost) - 1)


def grid_steps(gap_s: float, overhead_s: float) -> int:
    """Cells per tick that put every progress a tick can make on the grid: a whole tick, or a
    start's first tick past its restart (`gap - overhead mod gap`), to the millisecond. So the
    grid loses no progress and the optimum is exact. Where that takes more than
    `MAX_EXACT_STEPS` cells, `DEFAULT_STEPS_PER_TICK`, and the optimum is within the grid's
    rounding (a cheap schedule that ends just in time may then be missed)."""
    gap_ms = round(gap_s * 1000)
    if gap_ms <= 0:
        return DEFAULT_STEPS_PER_TICK
    partial_ms = round(overhead_s * 1000) % gap_ms
    steps = gap_ms // math.gcd(gap_ms, partial_ms)
    return steps if steps <= MAX_EXACT_STEPS else DEFAULT_STEPS_PER_TICK


def optimal(
    trace: SpotTrace, scenario: Scenario, *, steps_per_tick: int | None = None
) -> SimulationResult | None:
    """The cheapest schedule that meets `scenario.deadline_s`, as the simulator runs it; None
    when no schedule can (the deadline is shorter than the job plus one restart)."""
    return optimal_schedules(trace, scenario, [scenario.deadline_s], steps_per_tick)[0]


def optimal_schedules(
    trace: SpotTrace,
    scenario: Scenario,
    deadlines_s: Sequence[float],
    steps_per_tick: int | None = None,
) -> list[SimulationResult | None]:
    """`optimal` for the same job under each deadline of `deadlines_s` (the scenario's own is
    ignored), from one pass of the dynamic programme: the sweep's slacks share it."""
    gap = trace.gap_s
    if steps_per_tick is None:
        steps_per_tick = grid_steps(gap, scenario.overhead_s)
    if steps_per_tick < 1:
        raise ValueError("steps_per_tick must be >= 1")
    horizon = math.ceil(max(deadlines_s) / gap - _EPS)
    counts = trace.counts[scenario.start_tick : scenario.start_tick + horizon]
    spot_up = [count >= scenario.nodes for count in counts]  # the simulator's ticks
    grid = _Grid(scenario, gap, steps_per_tick)
    finishes = grid.solve(spot_up, sorted(set(deadlines_s)))
    results: list[SimulationResult | None] = []
    for deadline in deadlines_s:
        decisions = finishes.get(deadline)
        if decisions is None:
            if scenario.overhead_s + scenario.job_s > deadline + _EPS:
                results.append(None)
                continue
            decisions = (Decision.ON_DEMAND,)  # the grid's rounding lost a tight deadline
        result = simulate(
            trace, ReplayPolicy(tuple(decisions)), replace(scenario, deadline_s=deadline)
        )
        results.append(replace(result, gap_to_optimal=0.0) if result.met_deadline else None)
    return results


@dataclass
class _Grid:
    """The dynamic programme of one job: state 0 is `none`, 1..J spot with j ticks run since
    its start, J+1..2J on-demand likewise."""

    scenario: Scenario
    gap: float
    steps: int

    def __post_init__(self) -> None:
        overhead, gap = self.scenario.overhead_s, self.gap
        self.unit = gap / self.steps
        self.cells = max(1, math.ceil(self.scenario.job_s / self.unit - _EPS))
        self.ticks_to_pay = max(1, math.ceil(overhead / gap - _EPS))  # J
        # overhead left, and progress, of a tick run with j ticks already run on its market
        self.overhead_left = [max(0.0, overhead - j * gap) for j in range(self.ticks_to_pay + 1)]
        self.progress = [max(0.0, gap - left) for left in self.overhead_left]
        # cells a tick moves the work by, rounded down: the solve and its backtrack agree
        self.shifts = [int(p / self.unit + _EPS) for p in self.progress]

    def market_states(self, market: Decision) -> list[int]:
        first = 1 if market is Decision.SPOT else 1 + self.ticks_to_pay
        return list(range(first, first + self.ticks_to_pay))

    def solve(self, spot_up: list[bool], deadlines: list[float]) -> dict[float, list[Decision]]:
        """Deadline -> the cheapest schedule's decisions, tick by tick (absent: none found)."""
        import numpy

        job, unit, cells = self.scenario.job_s, self.unit, self.cells
        states = 1 + 2 * self.ticks_to_pay
        prices = {
            Decision.SPOT: float(self.scenario.prices.spot),
            Decision.ON_DEMAND: float(self.scenario.prices.on_demand),
        }
        cost = numpy.full((states, cells), numpy.inf)
        cost[0, 0] = 0.0
        choices = numpy.zeros((len(spot_up), states, cells), dtype=numpy.uint8)
        # the cell a job in the grid's last cell came from, where it came from further down
        # than its progress (a landing kept on the grid; see below); -1: the progress' own
        tails = numpy.full((len(spot_up), states), -1, dtype=numpy.int64)
        done = numpy.arange(cells) * unit  # work done in each cell, seconds
        best: dict[float, tuple[float, int, int, int, Decision]] = {}
        firsts = [int(numpy.searchsorted(done, job - p - _EPS)) for p in self.progress]
        for tick, up in enumerate(spot_up):
            elapsed = tick * self.gap
            open_deadlines = [d for d in deadlines if d > elapsed + _EPS]
            if not open_deadlines:
                break
            reach = min(cells, tick * self.steps + 1)  # no cell above is reached by now
            view = cost[:, :reach]
            new = numpy.full((states, cells), numpy.inf)
            chosen = choices[tick]
            chosen[0, :reach] = view.argmin(axis=0)
            new[0, :reach] = view.min(axis=0)
            markets = [Decision.ON_DEMAND] + ([Decision.SPOT] if up else [])
            for market in markets:
                price, mine = prices[market], self.market_states(market)
                others = [s for s in range(states) if s not in mine]
                sub = view[others]
                # (source state per cell, its cost per cell, ticks run on this market before)
                sources = [(numpy.asarray(others)[sub.argmin(axis=0)], sub.min(axis=0), 0)]
                sources += [
                    (numpy.full(reach, state), view[state], j)
                    for j, state in enumerate(mine, start=1)
                ]
                for source, values, ran in sources:
                    first = min(firsts[ran], reach)  # cells from here finish in this tick
                    # on-demand for good finishes from any cell (in one go, past this tick)
                    ends = 0 if market is Decision.ON_DEMAND else first
                    if ends < reach:
                        used = self.overhead_left[ran] + (job - done[ends:reach])
                        total = values[ends:] + used * price
                        for deadline in open_deadlines:
                            candidates = numpy.where(
                                elapsed + used <= deadline + _EPS, total, numpy.inf
                            )
                            at = int(candidates.argmin())
                            if candidates[at] < best.get(deadline, (math.inf,))[0]:
                                best[deadline] = (
                                    float(candidates[at]), tick, int(source[ends + at]),
                                    ends + at, market,
                                )  # fmt: skip
                    target = mine[min(ran, self.ticks_to_pay - 1)]
                    shift = self.shifts[ran]
                    incoming = values[:first] + self.gap * price
                    # cells whose progress, rounded, would run off the grid stay in its last
                    # cell: still rounded down, as a cell that did not finish must be
                    inside = max(0, min(first, cells - 1 - shift))
                    landing = new[target, shift : shift + inside]
                    better = incoming[:inside] < landing
                    landing[better] = incoming[:inside][better]
                    chosen[target, shift : shift + inside][better] = source[:inside][better]
                    if inside < first:
                        at = inside + int(incoming[inside:].argmin())
                        if incoming[at] < new[target, cells - 1]:
                            new[target, cells - 1] = incoming[at]
                            chosen[target, cells - 1] = source[at]
                            tails[tick, target] = at
            cost = new
        return {
            deadline: self._backtrack(choices, tails, tick, state, cell, market)
            for deadline, (_, tick, state, cell, market) in best.items()
        }

    def _market_of(self, state: int) -> Decision:
        if state == 0:
            return Decision.WAIT
        return Decision.SPOT if state <= self.ticks_to_pay else Decision.ON_DEMAND

    def _ran(self, state: int) -> int:
        """Ticks run on its market by the time a job in `state` decides again."""
        return 0 if state == 0 else (state - 1) % self.ticks_to_pay + 1

    def _backtrack(
        self,
        choices: np.ndarray,
        tails: np.ndarray,
        tick: int,
        state: int,
        cell: int,
        market: Decision,
    ) -> list[Decision]:
        """The decisions that lead to (`state`, `cell`) at `tick`, then `market` to finish."""
        decisions = [market]
        while tick > 0:
            tick -= 1
            source = int(choices[tick, state, cell])
            if state != 0 and cell == self.cells - 1 and tails[tick, state] >= 0:
                cell = int(tails[tick, state])
            elif state != 0:
                same = self._market_of(source) is self._market_of(state)
                ran = self._ran(source) if same else 0
                cell -= self.shifts[ran]
            decisions.append(self._market_of(state))
            state = source
        decisions.reverse()
        return decisions
