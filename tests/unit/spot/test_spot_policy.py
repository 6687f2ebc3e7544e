"""Spot policies: each rule of Uniform Progress and greedy, the safety net, the savings rule."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spot.policies import (
    POLICY_NAMES,
    Decision,
    PolicyInputs,
    PolicyState,
    Running,
    get_policy,
)
from orchestrator.spot.restart_overhead import DEFAULT_PRIOR_S, estimate_restart_overhead

HOUR = 3600.0
D = 600.0  # restart overhead used below: 10 minutes

UP = get_policy("uniform-progress")
GREEDY = get_policy("greedy")
ON_DEMAND = get_policy("on-demand")
SPOT_ONLY = get_policy("spot-only")


def inputs(
    *,
    work_left_h: float,
    time_left_h: float,
    total_work_h: float = 10.0,
    total_time_h: float = 12.0,
    spot: bool = False,
    running: Running = Running.NOTHING,
    overhead_s: float = D,
    interval_s: float = 0.0,
    spot_price: str = "1.02",
) -> PolicyInputs:
    return PolicyInputs(
        work_left_s=work_left_h * HOUR,
        time_left_s=time_left_h * HOUR,
        total_work_s=total_work_h * HOUR,
        total_time_s=total_time_h * HOUR,
        restart_overhead_s=overhead_s,
        spot_available=spot,
        running=running,
        spot_price=Decimal(spot_price),
        on_demand_price=Decimal("3.06"),
        decision_interval_s=interval_s,
    )


# A tight job (10 h of work in 12 h: 0.83 > 0.7), after 2 h: the line is at 2 x 10/12 h.
LINE_AT_2H = 2 * 10 / 12
TIGHT = PolicyState(line_start=(0.0, 0.0))


def test_registry_names_every_policy() -> None:
    assert POLICY_NAMES == ("uniform-progress", "greedy", "on-demand", "spot-only")
    assert [get_policy(name).name for name in POLICY_NAMES] == list(POLICY_NAMES)


def test_unknown_policy_is_bad_input() -> None:
    with pytest.raises(SpecError) as info:
        get_policy("cheapest")
    assert info.value.exit_code == 2
    assert "uniform-progress" in str(info.value)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_thrifty_rule_no_work_left_means_no_instance(name: str) -> None:
    for running in Running:
        decision, _ = get_policy(name).decide(
            inputs(work_left_h=0, time_left_h=1, spot=True, running=running), PolicyState()
        )
        assert decision is Decision.WAIT


def test_on_demand_policy_never_uses_spot() -> None:
    decision, state = ON_DEMAND.decide(
        inputs(work_left_h=5, time_left_h=50, spot=True), PolicyState()
    )
    assert decision is Decision.ON_DEMAND
    assert state.committed_on_demand


def test_spot_only_waits_even_past_the_deadline() -> None:
    assert SPOT_ONLY.decide(inputs(work_left_h=5, time_left_h=-1), PolicyState())[0] is (
        Decision.WAIT
    )
    assert SPOT_ONLY.decide(inputs(work_left_h=5, time_left_h=-1, spot=True), PolicyState())[0] is (
        Decision.SPOT
    )


# --------------------------------------------------------------------------------------------
# Greedy


def test_greedy_takes_spot_and_waits_while_slack_lasts() -> None:
    assert GREEDY.decide(inputs(work_left_h=8, time_left_h=10, spot=True), PolicyState())[0] is (
        Decision.SPOT
    )
    decision, state = GREEDY.decide(inputs(work_left_h=8, time_left_h=10), PolicyState())
    assert decision is Decision.WAIT
    assert not state.committed_on_demand


def test_greedy_safety_net_is_on_demand_for_good() -> None:
    # slack 19 min < 2 x 10 min: on-demand, and it stays there when spot comes back
    net = inputs(work_left_h=8, time_left_h=8 + 19 / 60)
    decision, state = GREEDY.decide(net, PolicyState())
    assert (decision, state.committed_on_demand) == (Decision.ON_DEMAND, True)
    later = replace(net, spot_available=True, running=Running.ON_DEMAND)
    assert GREEDY.decide(later, state)[0] is Decision.ON_DEMAND
    # 21 min of slack: not yet
    assert GREEDY.decide(inputs(work_left_h=8, time_left_h=8 + 21 / 60), PolicyState())[0] is (
        Decision.WAIT
    )


def test_safety_net_counts_the_wait_until_the_next_decision() -> None:
    """Waiting one more interval must still leave work + 2 restarts."""
    slack_25_min = inputs(work_left_h=8, time_left_h=8 + 25 / 60)
    assert GREEDY.decide(slack_25_min, PolicyState())[0] is Decision.WAIT
    with_interval = replace(slack_25_min, decision_interval_s=6 * 60)
    assert GREEDY.decide(with_interval, PolicyState())[0] is Decision.ON_DEMAND


@pytest.mark.parametrize("policy", [GREEDY, UP], ids=lambda p: p.name)
def test_exploitation_a_running_spot_instance_is_kept_past_the_net(policy: object) -> None:
    on_spot = inputs(work_left_h=8, time_left_h=8.1, spot=True, running=Running.SPOT)
    decision, state = policy.decide(on_spot, TIGHT)  # type: ignore[attr-defined]
    assert decision is Decision.SPOT
    assert not state.committed_on_demand
    # reclaimed (spot no longer available): the net fires
    reclaimed = replace(on_spot, spot_available=False)
    assert policy.decide(reclaimed, TIGHT)[0] is Decision.ON_DEMAND  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", [GREEDY, UP], ids=lambda p: p.name)
def test_spot_that_costs_as_much_as_on_demand_is_skipped(policy: object) -> None:
    decision, _ = policy.decide(  # type: ignore[attr-defined]
        inputs(work_left_h=1, time_left_h=20, spot=True, spot_price="3.06"), PolicyState()
    )
    assert decision is Decision.ON_DEMAND


# --------------------------------------------------------------------------------------------
# Uniform Progress


def test_up_behind_the_line_without_spot_goes_on_demand() -> None:
    # 2 h in, 1 h done: the line is at 1.67 h
    behind = inputs(work_left_h=9, time_left_h=10)
    assert UP.decide(behind, TIGHT)[0] is Decision.ON_DEMAND


def test_up_ahead_of_the_line_without_spot_waits() -> None:
    ahead = inputs(work_left_h=10 - LINE_AT_2H - 0.1, time_left_h=10)
    assert UP.decide(ahead, TIGHT)[0] is Decision.WAIT


def test_up_takes_risks_spot_even_when_behind() -> None:
    behind = inputs(work_left_h=9.5, time_left_h=10, spot=True)
    assert UP.decide(behind, TIGHT)[0] is Decision.SPOT


def test_up_leaves_on_demand_for_spot_as_soon_as_the_savings_pay_for_it() -> None:
    """On on-demand, spot is taken when it is there, even far behind the line, while the
    savings pay for the move; once they cannot, on-demand for good."""
    behind = inputs(work_left_h=9.5, time_left_h=10, spot=True, running=Running.ON_DEMAND)
    # 0.5 h done ($1.53 on on-demand), billed $1.83: $0.30 above its worth, $0.47 with a spot
    # start (10 min at 1.02), within the allowed restart at 3.06 ($0.51)
    assert UP.decide(replace(behind, spent_usd=Decimal("1.83")), TIGHT)[0] is Decision.SPOT
    # billed $1.90: $0.54 above with the spot start, more than the allowed restart
    decision, state = UP.decide(replace(behind, spent_usd=Decimal("1.90")), TIGHT)
    assert (decision, state.committed_on_demand) == (Decision.ON_DEMAND, True)


def test_up_behind_the_line_waits_when_the_savings_cannot_pay_the_round_trip() -> None:
    """No spot, behind the line: on-demand only if the savings pay for a restart there and one
    back to spot; otherwise wait (for spot, or the safety net), as greedy does."""
    behind = inputs(work_left_h=9, time_left_h=10)  # 1 h done, worth $3.06 on on-demand
    funded = replace(behind, spent_usd=Decimal("1.02"))  # $2.04 saved
    assert UP.decide(funded, TIGHT)[0] is Decision.ON_DEMAND
    unfunded = replace(behind, spent_usd=Decimal("3.20"))  # $0.14 lost: a spot start pays
    decision, state = UP.decide(unfunded, TIGHT)
    assert (decision, state.committed_on_demand) == (Decision.WAIT, False)
    assert UP.decide(replace(unfunded, spot_available=True), TIGHT)[0] is Decision.SPOT


def test_up_keeps_on_demand_while_there_is_no_spot_even_far_ahead() -> None:
    far_ahead = inputs(work_left_h=2, time_left_h=10, running=Running.ON_DEMAND)
    assert UP.decide(far_ahead, TIGHT)[0] is Decision.ON_DEMAND


def test_up_safety_net_commits_to_on_demand() -> None:
    net = inputs(work_left_h=5, time_left_h=5 + 15 / 60, spot=True)
    decision, state = UP.decide(net, TIGHT)
    assert (decision, state.committed_on_demand) == (Decision.ON_DEMAND, True)
    assert UP.decide(replace(net, running=Running.ON_DEMAND), state)[0] is Decision.ON_DEMAND


def test_up_loose_deadline_acts_greedy_until_tight() -> None:
    """Work left < 0.7 x time left: spot or wait, no line yet (the paper's appendix A.8)."""
    loose = inputs(work_left_h=9, time_left_h=20, total_work_h=10, total_time_h=22)
    decision, state = UP.decide(loose, PolicyState())
    assert decision is Decision.WAIT  # behind a line from (0, 0), but there is none yet
    assert state.line_start is None
    # 9 h of work in 12.8 h (0.703): the line starts here, at (9.2 h elapsed, 1 h of 10 done)
    tight = inputs(work_left_h=9, time_left_h=12.8, total_work_h=10, total_time_h=22)
    decision, state = UP.decide(tight, PolicyState())
    assert state.line_start == pytest.approx((9.2 * HOUR, 0.1))
    assert decision is Decision.WAIT  # on the line: nothing to catch up yet
    a_tick_later = replace(tight, time_left_s=tight.time_left_s - 600)
    assert UP.decide(a_tick_later, state)[0] is Decision.ON_DEMAND


def test_up_line_does_not_move_when_the_step_rate_is_measured_again() -> None:
    """The line is kept in shares of the job: the same steps, counted in seconds at a step
    rate measured again 25 % faster or slower, give the same decisions."""
    state = PolicyState(line_start=(2 * HOUR, 0.6))  # to (12 h, all): at 6 h, 0.76
    for done, expected in ((0.78, Decision.WAIT), (0.74, Decision.ON_DEMAND)):
        for seconds_per_step in (0.8, 1.0, 1.25):
            whole_h = 10 * seconds_per_step
            now = inputs(
                work_left_h=(1 - done) * whole_h, time_left_h=6, total_work_h=whole_h,
                overhead_s=HOUR / 2,
            )  # fmt: skip
            assert UP.decide(now, state) == (expected, state), (done, seconds_per_step)


def test_up_state_goes_in_and_out_unchanged_when_nothing_happens() -> None:
    state = PolicyState(line_start=(0.0, 0.0))
    _, after = UP.decide(inputs(work_left_h=9, time_left_h=11.5, spot=True), state)
    assert after == state


policies = st.sampled_from([get_policy(name) for name in POLICY_NAMES])
hours = st.floats(min_value=0, max_value=100, allow_nan=False)


@given(
    policy=policies,
    work=hours,
    total_work=st.floats(min_value=0.1, max_value=100),
    time_left=st.floats(min_value=-10, max_value=200),
    total_time=st.floats(min_value=0.1, max_value=200),
    spot=st.booleans(),
    running=st.sampled_from(list(Running)),
    committed=st.booleans(),
)
def test_no_policy_asks_for_spot_that_is_not_there(
    policy: object,
    work: float,
    total_work: float,
    time_left: float,
    total_time: float,
    spot: bool,
    running: Running,
    committed: bool,
) -> None:
    seen = inputs(
        work_left_h=work,
        time_left_h=time_left,
        total_work_h=total_work,
        total_time_h=total_time,
        spot=spot,
        running=running,
    )
    decision, state = policy.decide(seen, PolicyState(committed_on_demand=committed))  # type: ignore[attr-defined]
    if not spot:
        assert decision is not Decision.SPOT
    if committed and policy is not SPOT_ONLY and work > 0:
        assert decision is Decision.ON_DEMAND and state.committed_on_demand


# --------------------------------------------------------------------------------------------
# Restart overhead estimate


def test_overhead_prior_until_the_job_has_recovered() -> None:
    assert estimate_restart_overhead([]) == DEFAULT_PRIOR_S
    assert estimate_restart_overhead([], prior_s=90) == 90


def test_overhead_is_the_longest_recent_recovery() -> None:
    assert estimate_restart_overhead([100, 300, 200], prior_s=900) == 300
    # only the latest `window` count: an old slow recovery is forgotten
    assert estimate_restart_overhead([900, 100, 120, 110], window=3) == 120


@pytest.mark.parametrize(
    ("recoveries", "prior", "window"),
    [
        ([-1.0], 60.0, 5),
        ([float("nan")], 60.0, 5),
        ([], -5.0, 5),
        ([], float("inf"), 5),
        ([], 1.0, 0),
    ],
)
def test_overhead_refuses_nonsense(recoveries: list[float], prior: float, window: int) -> None:
    with pytest.raises(ValueError):
        estimate_restart_overhead(recoveries, prior_s=prior, window=window)
