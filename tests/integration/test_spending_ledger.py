"""The month's spend read from a real ledger through its read-only view, SQLite and PostgreSQL
alike (`report.spending.month_spans`): the spans the monthly caps count, billed to the same
owners, so the burn-down and the caps agree exactly; and a handful of statements whatever the
ledger's size."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from bench.team_seed import seed_rows, write_seed
from orchestrator.config import BudgetSettings
from orchestrator.control.money.team_caps import TeamCaps
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.ledger.view import LedgerView, open_view
from orchestrator.report.spending import burn_down, daily_spend, month_spans, spend_by_owner
from tests.integration.test_team_budget_ledger import MARCH, NOW, any_ledger, fill

__all__ = ["any_ledger"]  # the fixture, SQLite and PostgreSQL


def test_the_burn_down_and_the_monthly_caps_read_the_same_spend(any_ledger: Ledger) -> None:
    fill(any_ledger)
    with LedgerView.of_engine(any_ledger.engine) as view:
        spans = month_spans(view, NOW)
    caps = TeamCaps(
        BudgetSettings(monthly_usd=Decimal(500), user_monthly_usd=Decimal(40)), any_ledger
    )
    team, ann = caps.figures("ann", NOW)
    burn = burn_down(spans, Decimal(500), NOW)
    assert burn.spent_usd == team.spent_usd == Decimal(20 + 2 * (9 * 24 + 12) + 1 + 3)
    assert burn.hourly_usd == team.hourly_usd == 4
    owners = spend_by_owner(spans, MARCH, NOW)
    assert owners["ann"] == ann.spent_usd  # live-ann since March 1st
    assert owners == {"ann": Decimal(2 * 228), "bob": Decimal(21), "carl": Decimal(3)}
    days = daily_spend(spans, MARCH, NOW)
    assert len(days) == 10 and sum(d.usd for d in days) == burn.spent_usd
    assert days[0].usd == 20 + 2 * 24  # bob's two March hours, ann's first day


def test_month_spans_is_two_statements_whatever_the_number_of_jobs(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "orch.db")
    fill(Ledger(engine))
    engine.dispose()
    view = open_view(tmp_path / "orch.db")
    assert view is not None
    statements: list[str] = []
    view._source.connection.set_trace_callback(statements.append)  # type: ignore[union-attr]
    with view:
        started = time.perf_counter()
        spans = month_spans(view, NOW)
        took = time.perf_counter() - started
    assert len(statements) == 2 and len(spans) == 4  # the February lease is not read
    assert took < 0.5
    assert all(span.launched_at.tzinfo is not None for span in spans)
    assert {span.ended_at for span in spans} >= {None, MARCH + timedelta(hours=2)}


def test_month_spans_of_ten_thousand_jobs_reads_fast(tmp_path: Path) -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    engine = make_engine(tmp_path / "orch.db")
    write_seed(engine, seed_rows(10_000, now))
    engine.dispose()
    view = open_view(tmp_path / "orch.db")
    assert view is not None
    with view:
        started = time.perf_counter()
        spans = month_spans(view, now)
        took = time.perf_counter() - started
    assert len(spans) > 500  # December's of six months of jobs, and the live ones
    assert took < 0.1  # about 6 ms on an idle core
