"""Submits racing through a monthly cap: the admission lock makes "check what is left, then
record the reservation" one step, so together they never commit more than the cap, on SQLite
(a file lock beside the database) and PostgreSQL (an advisory lock)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import BudgetSettings
from orchestrator.control.money.team_caps import TeamCaps
from orchestrator.errors import BudgetRefused
from orchestrator.job_state import JobState
from orchestrator.ledger.admission import admission_lock
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.providers.plan import LaunchPlan
from orchestrator.spec.model import Budget

SUBMITS = 6
CAP = Decimal(35)  # room for three $10 jobs
PLAN = LaunchPlan(
    provider="local", nodes=1, gpus_per_node=1, market="on-demand", instance_type="local-1x",
    price_per_node_hour=Decimal(1), max_runtime_s=None, max_cost_usd=None,
)  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | Path]:
    if request.param == "postgresql":
        yield request.getfixturevalue("postgres_url")
    else:
        yield tmp_path / "orch.db"


def race(location: str | Path, *, locked: bool) -> list[str]:
    """SUBMITS threads, each with its own engine (as separate processes would be), admit a $10
    job and register it; the pause between the two stands for what a submit does between them.
    Returns the ids admitted."""
    admitted: list[str] = []
    start = threading.Barrier(SUBMITS)
    make_engine(location).dispose()  # the schema, before the race

    def submit(index: int) -> None:
        engine = make_engine(location)
        ledger = Ledger(engine)
        caps = TeamCaps(BudgetSettings(monthly_usd=CAP), ledger)
        start.wait()
        try:
            with admission_lock(engine) if locked else contextlib.nullcontext():
                checked = caps.admit(Budget(max_cost_usd=Decimal(10)), PLAN, "ann")
                time.sleep(0.05)  # on purpose: the others race while this one is admitted
                job_id = f"job-{index}"
                ledger.add_job(
                    Job(
                        id=job_id, name="j", state=JobState.PENDING, provider="local", nodes=1,
                        gpus_per_node=1, spec_json=json.dumps({}), spec_path="job.yaml",
                        created_at=datetime.now(UTC), owner="ann",
                    )
                )  # fmt: skip
                caps.reserve(job_id, checked)
                admitted.append(job_id)
        except BudgetRefused:
            pass
        finally:
            engine.dispose()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(SUBMITS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return admitted


def test_racing_submits_never_commit_more_than_the_cap(location: str | Path) -> None:
    assert len(race(location, locked=True)) == 3


def test_without_the_lock_racing_submits_pass_the_cap(location: str | Path) -> None:
    """What the lock prevents: the same race, unlocked, admits every submit."""
    assert len(race(location, locked=False)) > 3
