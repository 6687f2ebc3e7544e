"""The monthly caps read from a real ledger, SQLite and PostgreSQL alike (`TeamCaps`): which
leases count toward this month, whom they are billed to, what live jobs reserve, and what a
submit, a running job's check and its guards' lease make of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import BudgetSettings
from orchestrator.control.money.team_budget import RESERVED_EVENT
from orchestrator.control.money.team_caps import TeamCaps
from orchestrator.errors import BudgetRefused
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import IdleLease, Job, Lease, Ledger, make_engine
from orchestrator.providers.plan import LaunchPlan
from orchestrator.spec.model import Budget

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
MARCH = datetime(2025, 3, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    location = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgresql"
        else tmp_path / "orch.db"
    )
    engine = make_engine(location)
    yield Ledger(engine)
    engine.dispose()


def add_job(
    ledger: Ledger, job_id: str, owner: str | None, state: str = JobState.RUNNING, **budget: object
) -> Job:
    return ledger.add_job(
        Job(
            id=job_id, name="j", state=state, provider="local", nodes=1, gpus_per_node=1,
            spec_json=json.dumps({"budget": budget}), spec_path="job.yaml",
            created_at=MARCH - timedelta(days=5), owner=owner,
        )
    )  # fmt: skip


def add_lease(
    ledger: Ledger, job_id: str, price: str, start: datetime, end: datetime | None = None
) -> None:
    ledger.open_lease(
        Lease(
            job_id=job_id, cluster=job_id, provider="local", instance_id=f"i-{job_id}-{start:%d%H}",
            rank=0, market="on-demand", instance_type="local-1x", price_per_hour=Decimal(price),
            launched_at=start, ended_at=end,
        )
    )  # fmt: skip


def plan(hourly: str) -> LaunchPlan:
    return LaunchPlan(
        provider="local", nodes=1, gpus_per_node=1, market="on-demand", instance_type="local-1x",
        price_per_node_hour=Decimal(hourly), max_runtime_s=None, max_cost_usd=None,
    )  # fmt: skip


def fill(ledger: Ledger) -> None:
    """February's spend, March's, live jobs with and without a recorded plan, a kept cluster."""
    # ann's job of last month: ended before March, counts for nothing
    add_job(ledger, "feb", "ann", JobState.SUCCEEDED)
    add_lease(ledger, "feb", "100", MARCH - timedelta(days=3), MARCH - timedelta(days=2))
    # bob's job across the month's start: only its 2 h in March count ($20)
    add_job(ledger, "across", "bob", JobState.SUCCEEDED)
    add_lease(ledger, "across", "10", MARCH - timedelta(hours=1), MARCH + timedelta(hours=2))
    # ann's live job, started in February ($4 then), planned $30 at submit, open at $2/h since
    add_job(ledger, "live-ann", "ann", max_cost_usd=30)
    add_lease(ledger, "live-ann", "2", MARCH - timedelta(hours=2), None)
    ledger.add_event("live-ann", RESERVED_EVENT, "planned cost $30 reserved against the team")
    # bob's live job, no recorded plan: its spec's max_runtime at its open leases' rate, 10 h
    add_job(ledger, "live-bob", "bob", max_runtime=36000.0)
    add_lease(ledger, "live-bob", "1", NOW - timedelta(hours=1), None)
    # an older orch's pending job: no owner, no plan it could be priced at: reserves nothing
    add_job(ledger, "pending-old", None, JobState.PENDING, max_runtime=3600.0)
    # carl's kept cluster, idle for the last 3 h at $1/h: billed to its last job's owner
    clusters = Clusters(ledger)
    kept = clusters.create(
        "dev", provider="local", nodes=1, gpus_per_node=1, autostop_s=None, now=MARCH
    )
    add_job(ledger, "kept-job", "carl", JobState.SUCCEEDED)
    ledger.update_job("kept-job", cluster_id=kept.id)
    ledger._add_rows(
        [IdleLease(cluster_id=kept.id, instance_id="i-kept", rank=0, price_per_hour=Decimal(1),
                   launched_at=NOW - timedelta(hours=3))]
    )  # fmt: skip


def test_the_team_cap_counts_this_months_spend_and_live_jobs_reservations(
    any_ledger: Ledger,
) -> None:
    fill(any_ledger)
    caps = TeamCaps(BudgetSettings(monthly_usd=Decimal(500)), any_ledger)
    (team,) = caps.figures("ann", NOW)
    hours_in_march = Decimal(9 * 24 + 12)
    spent = (
        Decimal(20)  # across: its March hours
        + 2 * hours_in_march  # live-ann since March 1st
        + Decimal(1)  # live-bob's hour
        + Decimal(3)  # the kept cluster's idle hours
    )
    assert team.spent_usd == spent
    assert team.hourly_usd == 2 + 1 + 1
    # live-ann: $30 planned, $4 + 2 x hours spent already: more than planned, reserves 0;
    # live-bob: 10 h at $1/h = $10 planned, $1 spent: $9
    assert team.reserved_usd == 9
    assert team.left_usd == 500 - spent - 9


def test_a_user_cap_counts_only_its_owners_jobs_and_clusters(any_ledger: Ledger) -> None:
    fill(any_ledger)
    caps = TeamCaps(BudgetSettings(user_monthly_usd=Decimal(40)), any_ledger)
    (bob,) = caps.figures("bob", NOW)
    assert (bob.label, bob.spent_usd, bob.reserved_usd, bob.hourly_usd) == ("user bob", 21, 9, 1)
    (carl,) = caps.figures("carl", NOW)
    assert (carl.spent_usd, carl.hourly_usd) == (3, 1)
    (dora,) = caps.figures("dora", NOW)
    assert (dora.spent_usd, dora.reserved_usd, dora.left_usd) == (0, 0, 40)
    # bob has $10 left: a $10 job fits, one of $10.01 is refused
    fits = caps.check_submit(Budget(max_cost_usd=Decimal(10)), plan("1"), "bob", NOW)
    assert fits.refused is None
    with pytest.raises(BudgetRefused) as refused:
        caps.admit(Budget(max_cost_usd=Decimal("10.01")), plan("1"), "bob", NOW)
    assert refused.value.exit_code == 4
    assert "user bob budget budget.user_monthly_usd $40" in str(refused.value)


def test_an_admitted_job_reserves_its_plan_for_the_next_submit(any_ledger: Ledger) -> None:
    caps = TeamCaps(BudgetSettings(monthly_usd=Decimal(10)), any_ledger)
    # 4 h at $2/h: $8 planned, of $10
    checked = caps.admit(Budget(max_runtime=4 * 3600.0), plan("2"), "ann")
    assert checked.planned_usd == 8
    add_job(any_ledger, "first", "ann", JobState.PENDING, max_runtime=4 * 3600.0)
    caps.reserve("first", checked)
    (team,) = caps.figures("bob")
    assert (team.reserved_usd, team.left_usd) == (8, 2)
    with pytest.raises(BudgetRefused, match=r"\$8.00 reserved by live jobs"):
        caps.admit(Budget(max_cost_usd=Decimal(3)), plan("2"), "bob")
    # once the first job ends, its reservation is gone
    any_ledger.update_job("first", state=JobState.SUCCEEDED)
    assert caps.admit(Budget(max_cost_usd=Decimal(3)), plan("2"), "bob").refused is None


def test_running_jobs_stop_and_leases_end_on_the_team_rate(any_ledger: Ledger) -> None:
    now = datetime.now(UTC)
    add_job(any_ledger, "a", "ann")
    add_job(any_ledger, "b", "bob")
    add_lease(any_ledger, "a", "36", now - timedelta(seconds=500), None)  # $5 so far
    add_lease(any_ledger, "b", "324", now - timedelta(seconds=50), None)  # $4.50 so far
    caps = TeamCaps(BudgetSettings(monthly_usd=Decimal(20)), any_ledger)
    job_a = any_ledger.get_job("a")
    # $10.50 left at $360/h together: 105 s; job a alone would take over 17 minutes
    assert caps.stop_order(job_a, horizon_s=60) is None
    order = caps.stop_order(job_a, horizon_s=106)
    assert order is not None and order.state is JobState.BUDGET_STOPPED
    assert "team budget" in order.reason
    until = caps.lease_until(job_a, reserve_s=20, now=now)
    assert until is not None
    assert abs((until - now).total_seconds() - 85) < 0.5
