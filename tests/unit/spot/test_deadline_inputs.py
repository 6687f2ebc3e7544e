"""What the live controller measures for the spot policies: restart overheads from events,
step rates from progress lines, the work left, the fallback market, the stored driver state,
and which spot nodes a trace takes back."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.node.progress import parse_metrics
from orchestrator.providers.local.chaos import excess_spot_nodes
from orchestrator.providers.offers import Offer, cheapest_prices
from orchestrator.spot.inputs import (
    MIN_RATE_SPAN_S,
    DriverState,
    StepRate,
    Work,
    fallback_decision,
    restart_durations,
    running_on,
)
from orchestrator.spot.policies import Decision, PolicyState, Running

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- restart overheads from the job's events ------------------------------------------------


def test_each_start_runs_from_what_began_it_to_its_first_progress() -> None:
    events = [
        ("POLICY", at(0)),
        ("PROVISIONING", at(0)),
        ("LAUNCHED", at(1)),
        ("RUNNING", at(3)),
        ("TRAINING", at(7)),  # first start: 7 s
        ("CHECKPOINT", at(9)),
        ("PREEMPTED", at(20)),
        ("RECOVERING", at(21)),
        ("PROVISIONING", at(22)),
        ("TRAINING", at(31)),  # recovery: from the reclaim, 11 s
        ("SWITCHING", at(40)),
        ("SWITCHED", at(43)),
        ("PROVISIONING", at(43)),
        ("TRAINING", at(50)),  # planned move: from the decision, 10 s
    ]
    assert restart_durations(events) == [7.0, 11.0, 10.0]


def test_waiting_is_not_overhead_and_a_start_without_progress_is_cut_short() -> None:
    events = [
        ("PROVISIONING", at(0)),
        ("RUNNING", at(3)),
        ("PREEMPTED", at(5)),  # taken before it made progress: the next start counts from here
        ("PROVISIONING", at(6)),
        ("TRAINING", at(12)),
        ("SWITCHING", at(20)),  # moved to waiting
        ("WAITING", at(20)),
        ("PROVISIONING", at(80)),  # the wait ends: the start counts from its launch
        ("TRAINING", at(86)),
    ]
    assert restart_durations(events) == [7.0, 6.0]


def test_a_dead_controller_drops_the_start_it_left_behind() -> None:
    events = [
        ("PROVISIONING", at(0)),
        ("RESTARTED", at(300)),
        ("PROVISIONING", at(301)),
        ("TRAINING", at(306)),
        ("PREEMPTED", at(400)),
        ("ADOPTED", at(900)),
        ("TRAINING", at(905)),  # progress of an adopted run: no start to measure
    ]
    assert restart_durations(events) == [5.0]


def test_no_events_no_durations() -> None:
    assert restart_durations([]) == []
    assert restart_durations([("TRAINING", at(1))]) == []


# --- step rate and work -----------------------------------------------------------------------


def test_step_rate_is_measured_over_a_run_not_its_start() -> None:
    rate = StepRate()
    rate.add(10.0, 40)  # the first line of a run only marks the start
    assert rate.rate is None
    rate.add(11.0, 44)  # too short a stretch: lines come in bursts
    assert rate.rate is None
    rate.add(12.0, 48)
    assert rate.rate == pytest.approx(4.0)
    rate.add(20.0, 80)
    assert rate.rate == pytest.approx(4.0)


def test_step_rate_survives_a_restart_until_the_new_run_has_its_own() -> None:
    rate = StepRate(2.0)
    rate.new_run()
    rate.add(100.0, 80)
    rate.add(101.0, 88)
    assert rate.rate == 2.0
    rate.add(104.0, 104)
    assert rate.rate == pytest.approx(6.0)


def test_a_run_is_measured_from_the_newest_line_of_its_first_read() -> None:
    """A trainer at 4 steps/s, its log read once a second: steps 1-4 come in the read at 1.0,
    though step 1 was printed at 0.25. Measured from step 1, the rate would be 4.4/s."""
    rate = StepRate()
    for read in range(1, 4):
        for step in range(4 * read - 3, 4 * read + 1):
            rate.add(float(read), step)
    assert rate.rate == pytest.approx(4.0)


@given(
    step_s=st.floats(0.01, 5.0),
    read_every_s=st.floats(0.1, 30.0),
    first_read_s=st.floats(0.0, 30.0),
    reads=st.integers(2, 60),
)
def test_a_rate_read_in_bursts_is_off_by_at_most_one_step_over_the_run(
    step_s: float, read_every_s: float, first_read_s: float, reads: int
) -> None:
    """Whatever the watch interval: the steps counted and the time measured over belong to
    the same reads, so the error is at most the one step a read may fall short of."""
    rate = StepRate()
    printed = 0
    measured: list[float] = []  # times of the reads that had new lines
    for read in range(reads):
        read_at = first_read_s + read * read_every_s
        newest = math.floor(read_at / step_s + 1e-9)
        for step in range(printed + 1, newest + 1):
            rate.add(read_at, step)
        if newest > printed:
            measured.append(read_at)
        printed = newest
    span = measured[-1] - measured[0] if measured else 0.0
    if span < MIN_RATE_SPAN_S or rate.rate is None:
        assert rate.rate is None
        return
    assert abs(rate.rate - 1 / step_s) * span <= 1 + 1e-6


def test_a_step_going_back_starts_the_measurement_again() -> None:
    rate = StepRate()
    rate.add(0.0, 100)
    rate.add(3.0, 40)  # resumed from an older checkpoint without new_run()
    rate.add(6.0, 52)
    assert rate.rate == pytest.approx(4.0)


@given(
    steps_per_s=st.floats(0.01, 1000),
    total=st.integers(1, 10**6),
    done=st.integers(0, 2 * 10**6),
)
def test_work_left_and_total_are_steps_over_rate(steps_per_s: float, total: int, done: int) -> None:
    work = Work(step=done, total_steps=total, steps_per_s=steps_per_s)
    assert work.total_s == pytest.approx(total / steps_per_s)
    assert work.left_s == pytest.approx(max(0, total - done) / steps_per_s)
    assert 0 <= work.left_s <= work.total_s


def test_work_gives_the_policy_inputs() -> None:
    inputs = Work(step=40, total_steps=200, steps_per_s=4.0).inputs(
        time_left_s=90.0, total_time_s=120.0, restart_overhead_s=6.0, spot_available=True,
        running=Running.ON_DEMAND, spot_price=Decimal("1.02"), on_demand_price=Decimal("3.06"),
        decision_interval_s=1.0,
    )  # fmt: skip
    assert (inputs.work_left_s, inputs.total_work_s, inputs.progress_s) == (40.0, 50.0, 10.0)
    assert (inputs.elapsed_s, inputs.spot_pays) == (30.0, True)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf")])
def test_work_refuses_a_rate_that_is_not_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="steps_per_s"):
        Work(step=0, total_steps=10, steps_per_s=rate)


# --- fallback while the work is unknown ----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "spot", "pays", "running", "expected"),
    [
        ("uniform-progress", True, True, Running.NOTHING, Decision.SPOT),
        ("uniform-progress", False, True, Running.NOTHING, Decision.ON_DEMAND),
        ("uniform-progress", True, False, Running.NOTHING, Decision.ON_DEMAND),
        ("greedy", True, True, Running.NOTHING, Decision.SPOT),
        ("greedy", False, True, Running.NOTHING, Decision.ON_DEMAND),
        ("on-demand", True, True, Running.NOTHING, Decision.ON_DEMAND),
        ("spot-only", False, True, Running.NOTHING, Decision.WAIT),
        ("spot-only", True, False, Running.NOTHING, Decision.SPOT),
        ("uniform-progress", False, True, Running.SPOT, Decision.SPOT),  # a running node stays
        ("greedy", True, True, Running.ON_DEMAND, Decision.ON_DEMAND),
    ],
)
def test_fallback_never_waits_under_a_deadline_policy(
    policy: str, spot: bool, pays: bool, running: Running, expected: Decision
) -> None:
    got = fallback_decision(policy, spot_available=spot, spot_pays=pays, running=running)
    assert got is expected


def test_running_on_maps_markets() -> None:
    assert running_on("spot") is Running.SPOT
    assert running_on("on-demand") is Running.ON_DEMAND
    assert running_on(None) is Running.NOTHING


# --- the stored state -----------------------------------------------------------------------------


@given(
    market=st.sampled_from([None, *Decision]),
    committed=st.booleans(),
    line=st.none() | st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)),
    rate=st.none() | st.floats(1e-3, 1e4),
    total=st.none() | st.integers(1, 10**9),
)
def test_driver_state_round_trips(
    market: Decision | None,
    committed: bool,
    line: tuple[float, float] | None,
    rate: float | None,
    total: int | None,
) -> None:
    state = DriverState(
        market=market,
        policy=PolicyState(committed_on_demand=committed, line_start=line),
        steps_per_s=rate,
        total_steps=total,
    )
    assert DriverState.from_json(state.to_json()) == state


def test_a_version_1_line_in_seconds_is_read_as_a_share_of_the_job() -> None:
    """Version 1 kept the line's start in seconds of compute at the rate of the time: 50 s at
    4 steps/s is step 200 of 800, a quarter of the job."""
    old = (
        '{"version":1,"market":"on-demand","committed_on_demand":false,'
        '"line_start":[30.0,50.0],"steps_per_s":4.0,"total_steps":800}'
    )
    state = DriverState.from_json(old)
    assert state.policy.line_start == pytest.approx((30.0, 0.25))
    assert (state.market, state.steps_per_s, state.total_steps) == (Decision.ON_DEMAND, 4.0, 800)
    unknown_rate = old.replace('"steps_per_s":4.0', '"steps_per_s":null')
    assert DriverState.from_json(unknown_rate).policy.line_start is None  # drawn again


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"market": "moon"}'])
def test_an_unreadable_state_is_a_fresh_start(text: str | None) -> None:
    assert DriverState.from_json(text) == DriverState()


# --- what a trace takes back ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "granted", "taken"),
    [
        (["n0", "n1"], 2, []),
        (["n0", "n1"], 5, []),
        (["n0", "n1"], 1, ["n1"]),
        (["n0", "n1"], 0, ["n0", "n1"]),
        (["n0", "n1", "n2"], 1, ["n1", "n2"]),
        ([], 0, []),
        (["n0", "n1"], -1, ["n0", "n1"]),
    ],
)
def test_a_trace_takes_back_the_excess_highest_ranks_first(
    held: list[str], granted: int, taken: list[str]
) -> None:
    assert excess_spot_nodes(held, granted) == taken


# --- total steps in progress lines, prices of offers -------------------------------------------


def test_progress_lines_may_say_the_total_steps() -> None:
    metrics = parse_metrics('{"step": 12, "loss": 0.5, "total_steps": 480}')
    assert metrics is not None and (metrics.step, metrics.total_steps) == (12, 480)
    for bad in ('"480"', "0", "true", "4.5"):
        metrics = parse_metrics(f'{{"step": 12, "total_steps": {bad}}}')
        assert metrics is not None and metrics.total_steps is None


def offer(market: str, price: str, zone: str = "us-east-1a") -> Offer:
    return Offer(
        instance_type="g5.xlarge", region="us-east-1", zone=zone, market=market,  # type: ignore[arg-type]
        price_per_hour=Decimal(price), on_demand_price=Decimal("1.006"), gpu="A10G", gpus=1,
        gpu_memory_gib=24.0, vcpus=4, memory_gib=16.0,
    )  # fmt: skip


def test_cheapest_prices_per_market() -> None:
    prices = cheapest_prices(
        [offer("spot", "0.45"), offer("on-demand", "1.006"), offer("spot", "0.31", "us-east-1b")]
    )
    assert (prices.spot, prices.on_demand) == (Decimal("0.31"), Decimal("1.006"))
    only_od = cheapest_prices([offer("on-demand", "1.006")])
    assert (only_od.spot, only_od.on_demand) == (None, Decimal("1.006"))
