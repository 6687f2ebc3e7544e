"""Spend by UTC day, by owner and over the month against its cap, from hand-made spans, and
the two pictures of it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.control.money import team_budget
from orchestrator.report.spending import (
    DaySpend,
    Span,
    burn_down,
    daily_spend,
    month_window,
    render_burn_down_svg,
    render_daily_svg,
    span_cost,
    spend_by_owner,
)
from tests.support.fuzzing import examples

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)


def on(day: int, hour: float = 0.0) -> datetime:
    return MARCH + timedelta(days=day - 1, hours=hour)


SPANS = [
    # ann, across the month's start: only its hour in March counts ($3.60)
    Span("ann", Decimal("3.6"), on(1, -1), on(1, 1)),
    # bob, across midnight: 1.5 h on the 3rd ($10.80), 0.5 h on the 4th ($3.60)
    Span("bob", Decimal("7.2"), on(3, 22.5), on(4, 0.5)),
    # nobody's, ten seconds at $0.36/h ($0.001)
    Span(None, Decimal("0.36"), on(5), on(5) + timedelta(seconds=10)),
    # ann, still open: 6 h by now ($10.80)
    Span("ann", Decimal("1.8"), on(10, 6), None),
]


def test_daily_spend_splits_spans_at_utc_midnight_and_keeps_every_day() -> None:
    days = daily_spend(SPANS, MARCH, NOW)
    assert [d.day for d in days] == [date(2026, 3, n) for n in range(1, 11)]
    assert {d.day.day: d.usd for d in days if d.usd} == {
        1: Decimal("3.6"), 3: Decimal("10.8"), 4: Decimal("3.6"), 5: Decimal("0.001"),
        10: Decimal("10.8"),
    }  # fmt: skip
    assert all(d.usd == 0 for d in days if d.day.day in (2, 6, 7, 8, 9))
    # From the middle of a day: that day counts from there.
    assert daily_spend(SPANS, on(3, 23), on(4, 12)) == [
        DaySpend(date(2026, 3, 3), Decimal("7.2")),
        DaySpend(date(2026, 3, 4), Decimal("3.6")),
    ]
    assert daily_spend(SPANS, NOW, MARCH) == []


def test_spend_by_owner_largest_first_and_nobody_s_apart() -> None:
    assert list(spend_by_owner(SPANS, MARCH, NOW).items()) == [
        ("ann", Decimal("14.4")), ("bob", Decimal("14.4")), (None, Decimal("0.001")),
    ]  # fmt: skip
    assert spend_by_owner(SPANS, on(10), NOW) == {"ann": Decimal("10.8")}


def test_burn_down_projects_the_open_rate_to_the_month_end_and_finds_the_cap() -> None:
    burn = burn_down(SPANS, Decimal(100), NOW)
    assert (burn.month_start, burn.month_end) == (MARCH, APRIL)
    assert burn.spent_usd == Decimal("28.801")
    assert [d.usd for d in burn.cumulative][-1] == burn.spent_usd
    assert [d.usd for d in burn.cumulative][:4] == [
        Decimal("3.6"), Decimal("3.6"), Decimal("14.4"), Decimal("18.0")
    ]  # fmt: skip
    assert burn.hourly_usd == Decimal("1.8")
    assert burn.projected_usd == Decimal("28.801") + Decimal("1.8") * 516  # 21.5 days left
    # $71.199 left at $1.8/h: 39.555 h
    assert burn.runs_out_at == NOW + timedelta(seconds=142398)
    assert burn.even_pace_usd == Decimal(100) * Decimal(str(9.5 / 31))
    assert burn_down(SPANS, Decimal(1000), NOW).runs_out_at is None  # $957.60 by April
    assert burn_down(SPANS, Decimal(20), NOW).runs_out_at == NOW  # already spent
    uncapped = burn_down(SPANS, None, NOW)
    assert uncapped.runs_out_at is None and uncapped.even_pace_usd is None


def test_the_month_s_spend_is_the_team_cap_s_to_the_cent_and_beyond() -> None:
    team = team_budget.Scope("team", "budget.monthly_usd", Decimal(100))
    figures = team.figures(SPANS, [], NOW)  # the same spans: they have team_budget.Span's fields
    burn = burn_down(SPANS, Decimal(100), NOW)
    assert burn.spent_usd == figures.spent_usd and burn.hourly_usd == figures.hourly_usd
    theirs = [team_budget.Span(s.owner, s.price_per_hour, s.launched_at, s.ended_at) for s in SPANS]
    assert team.figures(theirs, [], NOW).spent_usd == burn.spent_usd
    ann = team_budget.Scope("user ann", "budget.user_monthly_usd", Decimal(50), "ann")
    assert spend_by_owner(SPANS, MARCH, NOW)["ann"] == ann.figures(SPANS, [], NOW).spent_usd


moments = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=examples(100), deadline=None)
@given(moments, moments, moments, st.decimals(min_value=0, max_value=100, places=4))
def test_span_cost_and_month_are_the_caps_own(
    launched: datetime, ended: datetime, now: datetime, price: Decimal
) -> None:
    start, _ = month_window(now)
    assert (start, month_window(now)[1]) == team_budget.month_window(now)
    for end in (ended, None):
        ours = Span("x", price, launched, end)
        theirs = team_budget.Span("x", price, launched, end)
        assert span_cost(ours, start, now) == team_budget.span_cost(theirs, start, now)


def svg_tree(data: bytes) -> ET.Element:
    root = ET.fromstring(data)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def ids(root: ET.Element, prefix: str) -> list[str]:
    return [e.get("id", "") for e in root.iter() if e.get("id", "").startswith(prefix)]


def texts(root: ET.Element) -> str:
    return " ".join("".join(e.itertext()) for e in root.iter("{http://www.w3.org/2000/svg}text"))


def test_the_daily_picture_has_a_bar_per_day_and_its_text_as_text() -> None:
    days = daily_spend(SPANS, MARCH, NOW)
    root = svg_tree(render_daily_svg(days))
    assert ids(root, "bar:") == [f"bar:2026-03-{n:02d}" for n in range(1, 11)]
    assert "spend per day (USD)" in texts(root)
    assert root.get("width") == "576pt"  # 8 inches, no pixel size
    empty = svg_tree(render_daily_svg([DaySpend(date(2026, 3, 1), Decimal(0))]))
    assert "nothing billed in these days" in texts(empty)


@pytest.mark.parametrize(("cap", "series"), [(Decimal(100), 4), (None, 2)])
def test_the_burn_down_draws_spend_projection_and_the_cap_with_its_pace(
    cap: Decimal | None, series: int
) -> None:
    root = svg_tree(render_burn_down_svg(burn_down(SPANS, cap, NOW)))
    found = sorted(set(ids(root, "series:")))
    assert len(found) == series
    assert {"series:spend", "series:projection"} <= set(found)
    if cap is None:
        assert "no monthly cap is set (budget.monthly_usd)" in texts(root)
    else:
        assert {"series:cap", "series:pace"} <= set(found)
        assert "cap $100.00" in texts(root)
