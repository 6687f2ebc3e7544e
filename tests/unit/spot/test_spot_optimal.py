"""The offline optimum (`orchestrator.spot.optimal`): hand-worked traces, the grid's
convergence, and that no policy beats it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.providers.traces import SpotTrace, load_trace
from orchestrator.spot.optimal import grid_steps, optimal, optimal_schedules, with_gap
from orchestrator.spot.policies import POLICY_NAMES, get_policy
from orchestrator.spot.simulate import Prices, Scenario, simulate
from tests.support.fuzzing import examples
from tests.unit.trace_files import availability_traces, shared_trace_paths

PRICES = Prices.from_ratio()  # 3.06 on-demand, 1.02 spot


def usd(seconds: float, price: Decimal) -> Decimal:
    return (Decimal(repr(seconds)) * price / 3600).quantize(Decimal("0.0001"))


def solve(counts: list[int], **scenario: float) -> object:
    trace = SpotTrace(name="t", gap_s=100.0, counts=tuple(counts))
    return optimal(trace, Scenario(prices=PRICES, **scenario))  # type: ignore[arg-type]


def test_waiting_for_a_long_spot_stretch_beats_taking_the_first_one() -> None:
    """Ticks of 100 s, spot in ticks 0-1 and 3-5, a 200 s job, 50 s restarts, deadline 1000 s.

    By hand: spot at tick 0 gives 150 s of work before the reclaim at tick 2, then a second
    restart: 200 + 100 s on spot at least. Waiting to tick 3 and running 50 + 200 s on spot
    ends at 550 s with 250 s billed; on-demand would cost 250 s at three times the price.
    """
    result = solve([1, 1, 0, 1, 1, 1] + [0] * 20, job_s=200, deadline_s=1000, overhead_s=50)
    assert result.cost == usd(250, PRICES.spot)  # type: ignore[attr-defined]
    assert (result.finish_s, result.restarts, result.preemptions) == (550, 1, 0)  # type: ignore[attr-defined]


def test_without_spot_the_optimum_is_on_demand() -> None:
    """No spot at all: one restart and the job on on-demand, 100 + 1000 s."""
    result = solve([0] * 30, job_s=1000, deadline_s=2000, overhead_s=100)
    assert result.cost == usd(1100, PRICES.on_demand)  # type: ignore[attr-defined]
    assert result.spot_s == 0  # type: ignore[attr-defined]


def test_a_tight_deadline_takes_every_spot_tick_then_on_demand() -> None:
    """Spot in ticks 0-4 only, a 600 s job, 50 s restarts, deadline 700 s.

    By hand: k ticks on spot (50 s restart, 100 k - 50 s of work), then on-demand for a
    restart and the rest, 700 - 100 k s, ends at 700 s whatever k; the cost
    100 k x 1.02 + (700 - 100 k) x 3.06 falls with k, so k = 5: 500 s spot, 200 s on-demand.
    """
    result = solve([1] * 5 + [0] * 10, job_s=600, deadline_s=700, overhead_s=50)
    assert result.cost == usd(500, PRICES.spot) + usd(200, PRICES.on_demand)  # type: ignore[attr-defined]
    assert result.finish_s == 700  # type: ignore[attr-defined]


def test_a_deadline_shorter_than_job_and_restart_has_no_optimum() -> None:
    """1000 s of work and a 100 s restart cannot end by 1050 s."""
    assert solve([1] * 30, job_s=1000, deadline_s=1050, overhead_s=100) is None
    policy = simulate(
        SpotTrace(name="t", gap_s=100.0, counts=(1,) * 30),
        get_policy("on-demand"),
        Scenario(job_s=1000, deadline_s=1050, overhead_s=100, prices=PRICES),
    )
    assert with_gap(policy, None).gap_to_optimal is None


@pytest.mark.parametrize("name", ["us-east-1a", "1-node_aws-02-15-2023_us-west-2a", "16-node"])
def test_a_grid_twice_as_fine_changes_the_optimum_by_under_half_a_percent(name: str) -> None:
    trace = load_trace(next(p for p in shared_trace_paths() if name in p.name))
    scenario = Scenario(job_s=40 * 3600, deadline_s=60 * 3600, overhead_s=720, prices=PRICES)
    deadlines = [40 * 3600 * (1 + slack / 100) for slack in (10, 30, 50, 100)]
    for start in (0, len(trace) // 3):
        at = Scenario(**{**scenario.__dict__, "start_tick": start})
        coarse = optimal_schedules(trace, at, deadlines, steps_per_tick=4)
        fine = optimal_schedules(trace, at, deadlines, steps_per_tick=8)
        for a, b in zip(coarse, fine, strict=True):
            assert a is not None and b is not None
            assert abs(a.cost / b.cost - 1) < Decimal("0.005"), (a.cost, b.cost)


def traces() -> st.SearchStrategy[SpotTrace]:
    return availability_traces([60.0, 195.0, 300.0], longest_run=12, most_runs=40, repeat=20)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=traces(),
    job_h=st.floats(0.2, 4),
    overhead_s=st.integers(0, 1200),  # restarts are measured in seconds: the exact grid
    slack=st.floats(0.05, 1.0),
)
def test_no_policy_that_meets_the_deadline_beats_the_optimum(
    trace: SpotTrace, job_h: float, overhead_s: int, slack: float
) -> None:
    job_s = job_h * 3600
    scenario = Scenario(
        job_s=job_s, deadline_s=(job_s + overhead_s) * (1 + slack), overhead_s=overhead_s,
        prices=PRICES,
    )  # fmt: skip
    best = optimal(trace, scenario)
    assert best is not None and best.met_deadline
    for name in POLICY_NAMES:
        result = with_gap(simulate(trace, get_policy(name), scenario), best)
        if result.met_deadline:
            # exact grid: only the replay's rounding to a fraction of a cent is left
            assert result.gap_to_optimal is not None and result.gap_to_optimal > -0.005, name


def test_a_trace_shorter_than_the_deadline_is_finished_on_on_demand_taken_for_good() -> None:
    """20 one-minute ticks of spot, then the trace ends; the job is 1 h with a 2 h deadline.
    The simulator runs past a trace's end only on on-demand taken for good at a tick of the
    trace, so the optimum is spot for 19 ticks and on-demand from the last one: 19 min at 1.02
    and 41 min at 3.06 = 0.323 + 2.091 = $2.414."""
    trace = SpotTrace(name="short", gap_s=60.0, counts=(1,) * 20)
    scenario = Scenario(job_s=3600, deadline_s=7200, overhead_s=0.0, prices=PRICES)
    best = optimal(trace, scenario)
    assert best is not None and best.met_deadline
    assert best.cost == Decimal("2.414")


def test_a_restart_of_a_fraction_of_a_grid_cell_keeps_the_work_on_the_grid() -> None:
    """A restart of 3.6 microseconds: a tick's progress is a hair under 4 cells, and a job
    that ends a hair under the whole job must stay in the grid's last cell, not fall off it.
    No spot at all: on-demand from the start, 1 h at 3.06 = $3.06."""
    trace = SpotTrace(name="none", gap_s=60.0, counts=(0,) * 20)
    scenario = Scenario(job_s=3600, deadline_s=7200, overhead_s=3.6e-6, prices=PRICES)
    best = optimal(trace, scenario)
    assert best is not None and best.met_deadline and best.cost == Decimal("3.06")


def test_a_cheap_schedule_that_ends_just_in_time_is_found() -> None:
    """Spot for 12 ticks of 195 s, then 9 without, over and over; a 45 min job, 14 min
    restarts, deadline 6195 s. Spot alone: 12 ticks (14 min restart, 25 min of work), a wait,
    then 2040 s more from tick 21: done at 6135 s, 4380 s at 1.02 = $1.241. A grid rounding
    the first tick past each restart down lost 2 x 37.5 s, missed the deadline and took a
    $2.03 schedule; on a grid the partial tick falls on (13 cells a tick), none is lost."""
    trace = SpotTrace(name="12-9", gap_s=195.0, counts=((1,) * 12 + (0,) * 9) * 4)
    scenario = Scenario(job_s=2700, deadline_s=6195, overhead_s=840, prices=PRICES)
    best = optimal(trace, scenario)
    assert best is not None and best.met_deadline and best.cost <= Decimal("1.241")
    assert grid_steps(195.0, 840) == 13 and grid_steps(60.0, 720) == 1
    assert grid_steps(60.0, 0.1234567) == 4  # no small exact grid: the default one
