"""A running job stops itself before the team's monthly spend passes `budget.monthly_usd`,
projecting every live job's nodes, not only its own.

The ledger holds a teammate's job billing $72/h (no controller of this ORCH_HOME drives it:
it has no job record here, as a job of another machine on a shared ledger). The job
submitted here costs $36/h and has its own `max_cost_usd`, which it never comes near: it is
the team's total rate that stops it, with the emergency checkpoint pulled, BUDGET_STOPPED
and exit 4, and the team's spend at its end is still under the cap.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.control.money.team_budget import Scope, Span
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine, utcnow
from tests.support.helpers import (
    assert_nothing_left,
    counter_run,
    counter_workdir,
    fast_env,
    run_orch,
)

pytestmark = pytest.mark.timeout(180)

CAP = Decimal("2.4")
TEAMMATE_PRICE = Decimal(72)  # $0.02 a second
PRICE = Decimal(36)  # this job's node: $0.01 a second


def teammate_job(home: Path, *, billing_for_s: float) -> None:
    """A teammate's running job whose node has billed `billing_for_s` seconds by now."""
    engine = make_engine(home / "orch.db")
    try:
        ledger = Ledger(engine)
        started = utcnow() - timedelta(seconds=billing_for_s)
        ledger.add_job(
            Job(
                id="teammate-1", name="teammate", state=JobState.RUNNING, provider="local",
                nodes=1, gpus_per_node=1, spec_json="{}", spec_path="job.yaml",
                created_at=started, started_at=started, owner="bob",
            )
        )  # fmt: skip
        ledger.open_lease(
            Lease(
                job_id="teammate-1", cluster="teammate-1", provider="local",
                instance_id="i-teammate", rank=0, market="on-demand", instance_type="local-1x",
                price_per_hour=TEAMMATE_PRICE, launched_at=started,
            )
        )  # fmt: skip
    finally:
        engine.dispose()


def team_spend_at(home: Path, at: datetime) -> Decimal:
    """What every lease of the ledger cost this month until `at`."""
    engine = make_engine(home / "orch.db")
    try:
        leases = Ledger(engine).leases()
    finally:
        engine.dispose()
    spans = [
        Span(None, lease.price_per_hour, lease.launched_at, lease.ended_at) for lease in leases
    ]
    return Scope("team", "budget.monthly_usd", CAP).figures(spans, [], at).spent_usd


def test_a_running_job_stops_before_the_team_spend_passes_the_cap(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    home.mkdir()
    (home / "config.yaml").write_text(f"budget: {{monthly_usd: {CAP}}}\naws: {{owner: ann}}\n")
    # $1.20 spent by the teammate; this job plans $0.50 of the $1.20 left. With the stop's
    # horizon (2 s to the next check + 25 s) at $108/h together, the team must stop at about
    # $1.59 spent, some 15 s from now; this job alone would stop only at its own $0.50.
    teammate_job(home, billing_for_s=60)
    counter_workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: teamcap\nworkdir: work\n"
        f"run: {counter_run(4000, checkpoint_every=100000)}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 5}\n"
        "budget: {max_cost_usd: 0.5}\n"
    )
    env = fast_env(home, ORCH_LOCAL_PRICE_PER_HOUR=str(PRICE), ORCH_STOP_ALLOWANCE="25")
    result = run_orch(["submit", str(spec), "--json"], env, timeout=150)
    assert result.returncode == 4, result.stdout + result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "BUDGET_STOPPED"
    assert "team budget budget.monthly_usd $2.4" in job["reason"], job["reason"]
    assert Decimal(str(job["spend_usd"])) < Decimal("0.5")  # its own cap was far away
    assert job["checkpoints"], "the emergency checkpoint was not pulled"
    ended = max(datetime.fromisoformat(lease["ended_at"]) for lease in job["leases"])
    assert team_spend_at(home, ended) <= CAP
    assert_nothing_left(job)
