"""The monthly budgets' arithmetic (`orchestrator.control.money.team_budget`): the UTC month, spend
clipped to it, per-owner keying, reservations of live jobs, the refusal, the stop and the
lease. Pure: rows and times are made here."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.control.money.team_budget import (
    LiveJob,
    Scope,
    Span,
    month_window,
    planned_cost,
    refusal,
    reservation_message,
    reserved_amount,
    runs_out_at,
    scopes,
    span_cost,
    stop_order,
)
from orchestrator.job_state import JobState
from orchestrator.node.guard_protocol import GuardTerms

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
MARCH = datetime(2025, 3, 1, tzinfo=UTC)
TEAM = Scope("team", "budget.monthly_usd", Decimal("100"))


def span(price: str, start: datetime, end: datetime | None = None, owner: str = "ann") -> Span:
    return Span(owner, Decimal(price), start, end)


@pytest.mark.parametrize(
    ("now", "start", "end"),
    [
        (NOW, MARCH, datetime(2025, 4, 1, tzinfo=UTC)),
        (MARCH, MARCH, datetime(2025, 4, 1, tzinfo=UTC)),  # the first instant is the month's
        (
            datetime(2025, 3, 31, 23, 59, 59, 999999, tzinfo=UTC),
            MARCH,
            datetime(2025, 4, 1, tzinfo=UTC),
        ),
        (
            datetime(2024, 12, 31, 23, 0, tzinfo=UTC),  # December rolls into the next year
            datetime(2024, 12, 1, tzinfo=UTC),
            datetime(2025, 1, 1, tzinfo=UTC),
        ),
        (
            datetime(2024, 2, 29, 8, tzinfo=UTC),
            datetime(2024, 2, 1, tzinfo=UTC),
            datetime(2024, 3, 1, tzinfo=UTC),
        ),
    ],
)
def test_the_month_is_the_utc_calendar_month(now: datetime, start: datetime, end: datetime) -> None:
    assert month_window(now) == (start, end)


def test_the_month_is_utc_whatever_zone_the_time_is_given_in() -> None:
    # 00:30 on April 1st in UTC+2 is still March 31st in UTC
    east = datetime(2025, 4, 1, 0, 30, tzinfo=timezone(timedelta(hours=2)))
    assert month_window(east) == (MARCH, datetime(2025, 4, 1, tzinfo=UTC))


def test_a_span_is_clipped_to_the_month_and_to_now() -> None:
    # launched 2 h before the month began, still open: only the 10.5 days since March 1st count
    open_since_february = span("3.60", MARCH - timedelta(hours=2))
    hours = Decimal(9 * 24 + 12)
    assert span_cost(open_since_february, MARCH, NOW) == Decimal("3.60") * hours
    # ended before the month: nothing; ended inside it: up to its end
    assert (
        span_cost(span("9", MARCH - timedelta(days=3), MARCH - timedelta(days=1)), MARCH, NOW) == 0
    )
    ended = span("3.60", MARCH - timedelta(hours=1), MARCH + timedelta(hours=1))
    assert span_cost(ended, MARCH, NOW) == Decimal("3.60")
    # a lease "ending" after now (a clock ahead) bills only until now
    assert span_cost(
        span("3.60", NOW - timedelta(hours=1), NOW + timedelta(hours=5)), MARCH, NOW
    ) == Decimal("3.60")


def test_the_team_counts_everyone_a_user_cap_only_its_owner() -> None:
    spans = [
        span("36", NOW - timedelta(seconds=100), owner="ann"),  # $1 so far, open
        span("72", NOW - timedelta(seconds=200), NOW - timedelta(seconds=100), owner="bob"),
        span("18", NOW - timedelta(seconds=400), owner=None),  # an older orch's job: team only
    ]
    team = TEAM.figures(spans, [], NOW)
    assert team.spent_usd == Decimal(1) + Decimal(2) + Decimal(2)
    assert team.hourly_usd == Decimal(54)
    ann = scopes(monthly_usd=None, user_monthly_usd=Decimal(10), owner="ann")[0]
    figures = ann.figures(spans, [], NOW)
    assert (figures.spent_usd, figures.hourly_usd, figures.label) == (1, 36, "user ann")
    assert figures.setting == "budget.user_monthly_usd"


def test_which_caps_apply() -> None:
    both = scopes(monthly_usd=Decimal(500), user_monthly_usd=Decimal(50), owner="ann")
    assert [(s.label, s.cap_usd, s.owner) for s in both] == [
        ("team", 500, None),
        ("user ann", 50, "ann"),
    ]
    assert scopes(monthly_usd=None, user_monthly_usd=Decimal(50), owner=None) == []
    assert scopes(monthly_usd=None, user_monthly_usd=None, owner="ann") == []


def test_live_jobs_reserve_what_they_may_still_spend() -> None:
    live = [
        LiveJob("a", "ann", Decimal(30), Decimal(12)),  # 18 to go
        LiveJob("b", "bob", Decimal(10), Decimal(15)),  # overspent: reserves nothing, never less
        LiveJob("c", "bob", None, Decimal(5)),  # no planned cost: reserves nothing
    ]
    figures = TEAM.figures([span("3.60", NOW - timedelta(hours=1))], live, NOW)
    assert figures.reserved_usd == 18
    assert figures.left_usd == Decimal(100) - Decimal("3.60") - 18
    bob = Scope("user bob", "budget.user_monthly_usd", Decimal(40), "bob").figures([], live, NOW)
    assert bob.reserved_usd == 0 and bob.left_usd == 40


def test_planned_cost_is_max_cost_else_the_plan_over_max_runtime() -> None:
    assert planned_cost(max_cost_usd=Decimal(7), max_runtime_s=3600, hourly_usd=Decimal(50)) == 7
    assert planned_cost(max_cost_usd=None, max_runtime_s=5400, hourly_usd=Decimal(4)) == 6
    assert planned_cost(max_cost_usd=None, max_runtime_s=None, hourly_usd=Decimal(4)) is None


def test_a_job_that_fits_exactly_is_admitted_and_a_cent_more_is_refused() -> None:
    figures = TEAM.figures(
        [span("36", NOW - timedelta(hours=1))], [LiveJob("a", "x", Decimal(14), Decimal(0))], NOW
    )
    assert figures.left_usd == 50
    assert refusal(figures, Decimal(50)) is None
    refused = refusal(figures, Decimal("50.01"))
    assert refused is not None
    text = refused.message()
    for figure in ("$100", "$50.01", "spent $36.00", "$14.00 reserved", "$50.00 left", "2025-03"):
        assert figure in text, (figure, text)
    assert "at most $50.00" in refused.hint() and "budget.monthly_usd" in refused.hint()


def test_a_job_without_a_limit_is_refused_with_the_way_to_give_it_one() -> None:
    refused = refusal(TEAM.figures([], [], NOW), None)
    assert refused is not None
    assert "neither budget.max_cost_usd nor budget.max_runtime" in refused.message()
    assert "--max-cost" in refused.hint() and "$100.00" in refused.hint()


money = st.decimals(min_value=0, max_value=1000, places=2)


@given(
    cap=st.decimals(min_value=Decimal("0.01"), max_value=1000, places=2),
    spent=st.lists(st.tuples(money, st.integers(1, 30 * 24 * 3600)), max_size=5),
    live=st.lists(st.tuples(money, money), max_size=5),
    submits=st.lists(st.one_of(st.none(), money), min_size=1, max_size=8),
)
def test_admitted_jobs_never_plan_past_the_cap(
    cap: Decimal,
    spent: list[tuple[Decimal, int]],
    live: list[tuple[Decimal, Decimal]],
    submits: list[Decimal | None],
) -> None:
    """Whatever the ledger holds, submits admitted one after another never commit more than
    the cap: spent this month + what live jobs may still spend + the new plans <= cap."""
    scope = Scope("team", "budget.monthly_usd", cap)
    spans = [
        span(str(usd * 3600 / seconds), NOW - timedelta(seconds=seconds), NOW)
        for usd, seconds in spent
    ]
    jobs = [LiveJob(f"j{i}", "ann", planned, used) for i, (planned, used) in enumerate(live)]
    for i, planned in enumerate(submits):
        if refusal(scope.figures(spans, jobs, NOW), planned) is None:
            assert planned is not None, "a job without a planned cost was admitted"
            jobs.append(LiveJob(f"new{i}", "ann", planned, Decimal(0)))
            after = scope.figures(spans, jobs, NOW)
            assert after.spent_usd + after.reserved_usd <= cap


def test_a_running_job_stops_when_the_team_rate_would_reach_the_cap() -> None:
    # $95 spent, the team bills $360/h together: $1 every 10 s
    spans = [
        span("95", NOW - timedelta(hours=1), NOW),
        span("300", NOW),
        span("60", NOW, owner="bob"),
    ]
    figures = TEAM.figures(spans, [], NOW)
    assert (figures.spent_usd, figures.hourly_usd) == (95, 360)
    assert stop_order(figures, horizon_s=49) is None  # $99.90 by then
    order = stop_order(figures, horizon_s=50)  # $100 by then
    assert order is not None
    assert (order.state, order.exit_code) == (JobState.BUDGET_STOPPED, 4)
    assert "team budget budget.monthly_usd $100" in order.reason
    # one job alone ($60/h) would run on for minutes: the team's rate is what counts
    alone = TEAM.figures([span("95", NOW - timedelta(hours=1), NOW), span("60", NOW)], [], NOW)
    assert stop_order(alone, horizon_s=50) is None


def test_the_lease_runs_out_when_the_team_would_pass_the_cap() -> None:
    figures = TEAM.figures([span("90", NOW - timedelta(hours=1), NOW), span("36", NOW)], [], NOW)
    # $10 left at $36/h: 1000 s, less 20 s for the stop
    assert runs_out_at(figures, reserve_s=20) == NOW + timedelta(seconds=980)
    # a launch of $36/h more halves it
    assert runs_out_at(figures, reserve_s=20, extra_hourly_usd=Decimal(36)) == NOW + timedelta(
        seconds=480
    )
    # nothing billing: no lease; a cap already passed: now
    assert runs_out_at(TEAM.figures([], [], NOW), reserve_s=20) is None
    spent = TEAM.figures([span("200", NOW - timedelta(hours=1), NOW), span("1", NOW)], [], NOW)
    assert runs_out_at(spent, reserve_s=20) == NOW


@given(amount=st.decimals(min_value=0, max_value=10**9, places=6))
def test_the_recorded_planned_cost_reads_back_exactly(amount: Decimal) -> None:
    message = reservation_message(amount, [TEAM.figures([], [], NOW)])
    assert reserved_amount(message) == amount
    assert reserved_amount("checkpoint step-000012 pulled") is None


def test_a_launch_under_a_team_cap_gets_a_lease_that_counts_the_others_rate() -> None:
    """The guard terms a launch is armed with: what is left of each monthly cap lasts at the
    rate of the leases already open in it plus the launch's own nodes."""
    terms = GuardTerms(
        job_id="j", interval_s=5.0, silence_s=15.0, allowance_s=100.0, deadman_s=600.0,
        stop_grace_s=5.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        budget_left_usd=Decimal(100), stop_allowance_s=15.0,
        # $2 left of the team's month, others billing $18/h; $50 left of the user's, at $0/h
        shared_budgets=((Decimal(2), Decimal(18)), (Decimal(50), Decimal(0))),
    )  # fmt: skip
    document = json.loads(terms.for_node(now=NOW, hourly_usd=Decimal(18), poweroff="true"))
    # $2 at $36/h: 200 s, less 20 s for the stop
    assert document["lease_until"] == (NOW + timedelta(seconds=180)).timestamp()
    assert "shared_budgets" not in document
    alone = json.loads(
        replace(terms, shared_budgets=()).for_node(now=NOW, hourly_usd=Decimal(18), poweroff="true")
    )
    assert alone["lease_until"] == (NOW + timedelta(seconds=20000 - 20)).timestamp()
