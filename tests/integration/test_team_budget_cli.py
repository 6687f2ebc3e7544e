"""`orch submit` under a monthly budget (`budget.monthly_usd`, `budget.user_monthly_usd`): a job
whose planned cost does not fit in what is left is refused before anything is launched (exit
4, with the figures); `--dry-run` shows them. On a PostgreSQL ledger two ORCH_HOMEs (two
people's machines) share one cap: what one spent counts against the other's submit.
"""

from __future__ import annotations

import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from tests.support.helpers import assert_nothing_provisioned, fast_env, orch_env, run_orch

pytestmark = pytest.mark.timeout(240)


def job_file(directory: Path, budget: str = "{max_runtime: 1h}", run: str = "echo hi") -> Path:
    (directory / "work").mkdir(exist_ok=True)
    path = directory / "job.yaml"
    path.write_text(
        f"name: team\nworkdir: work\nrun: {run}\nlauncher: none\nbudget: {budget}\n"
        "resources: {nodes: 2}\n"
    )
    return path


def assert_no_job(home: Path) -> None:
    assert_nothing_provisioned(home)
    if (home / "orch.db").exists():
        with sqlite3.connect(home / "orch.db") as db:
            assert db.execute("select count(*) from job").fetchone() == (0,)


@pytest.mark.parametrize("flags", [[], ["--detach"]])
def test_a_job_that_does_not_fit_the_team_budget_is_refused_with_the_figures(
    tmp_path: Path, flags: list[str]
) -> None:
    home = tmp_path / "orch"
    # 2 nodes x $3/h for max_runtime 1 h: $6 planned, of a $5 month
    env = orch_env(home, ORCH_LOCAL_PRICE_PER_HOUR="3", ORCH_BUDGET_MONTHLY_USD="5")
    result = run_orch(["submit", str(job_file(tmp_path)), *flags], env)
    assert result.returncode == 4, result.stdout + result.stderr
    for figure in (
        "planned cost $6.00",
        "team budget budget.monthly_usd $5",
        "spent $0.00 this month",
        "$0.00 reserved by live jobs",
        "$5.00 left",
        "at most $5.00",  # the hint
    ):
        assert figure in result.stderr, (figure, result.stderr)
    assert_no_job(home)


def test_the_dry_run_shows_the_figures_and_the_refusal(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    env = orch_env(home, ORCH_LOCAL_PRICE_PER_HOUR="3", ORCH_BUDGET_MONTHLY_USD="5")
    spec = job_file(tmp_path)
    shown = run_orch(["submit", str(spec), "--dry-run"], env)
    assert shown.returncode == 0, shown.stderr
    assert "planned cost $6.00; the team budget budget.monthly_usd $5" in shown.stdout
    assert "a submit would be refused" in shown.stdout
    document = json.loads(run_orch(["submit", str(spec), "--dry-run", "--json"], env).stdout)
    team = document["team_budget"]
    assert Decimal(team["planned_usd"]) == 6
    assert team["caps"][0]["cap_usd"] == "5" and team["caps"][0]["left_usd"] == "5.00"
    assert team["refused"]
    # with a cap it fits in: no refusal
    fits = run_orch(["submit", str(spec), "--dry-run", "--json", "--max-cost", "4"], env)
    assert json.loads(fits.stdout)["team_budget"]["refused"] is None


def test_a_job_without_a_limit_is_refused_with_the_way_to_give_it_one(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    env = orch_env(home, ORCH_BUDGET_USER_MONTHLY_USD="50")
    result = run_orch(["submit", str(job_file(tmp_path, budget="{}"))], env)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "neither budget.max_cost_usd nor budget.max_runtime" in result.stderr
    assert "user_monthly_usd $50" in result.stderr and "--max-cost" in result.stderr
    assert_no_job(home)


def test_two_machines_on_one_postgresql_ledger_share_the_cap(
    tmp_path: Path, postgres_url: str
) -> None:
    """ann's machine runs a job; bob's machine, another ORCH_HOME on the same database, sees
    her spend in the team's month (not in his own user cap) and is refused what no longer
    fits."""
    ann_home, bob_home = tmp_path / "ann", tmp_path / "bob"
    for home, owner in ((ann_home, "ann"), (bob_home, "bob")):
        home.mkdir()
        (home / "config.yaml").write_text(
            f"aws: {{owner: {owner}}}\nbudget: {{monthly_usd: 1, user_monthly_usd: 1}}\n"
        )
    ann_dir, bob_dir = tmp_path / "ann-job", tmp_path / "bob-job"
    ann_dir.mkdir()
    bob_dir.mkdir()
    shared = {"ORCH_DATABASE_URL": postgres_url, "ORCH_LOCAL_PRICE_PER_HOUR": "36"}
    # ann: 2 nodes at $36/h for at most 30 s: $0.60 planned; it runs a second or so
    ann = run_orch(
        ["submit", str(job_file(ann_dir, "{max_runtime: 30s}", "sleep 1")), "--json"],
        fast_env(ann_home, **shared),
        timeout=180,
    )
    assert ann.returncode == 0, ann.stdout + ann.stderr
    spent = Decimal(str(json.loads(ann.stdout)["spend_usd"]))
    assert spent > 0

    bob_env = orch_env(bob_home, **shared)
    spec = job_file(bob_dir, "{max_cost_usd: 0.99}")
    shown = run_orch(["submit", str(spec), "--dry-run", "--json"], bob_env)
    assert shown.returncode == 0, shown.stderr
    team, user = json.loads(shown.stdout)["team_budget"]["caps"]
    assert team["scope"] == "team" and user["scope"] == "user bob"
    cents = Decimal("0.01")
    assert Decimal(team["spent_usd"]) == spent.quantize(cents, rounding="ROUND_DOWN")
    assert Decimal(user["spent_usd"]) == 0
    refused = run_orch(["submit", str(spec)], bob_env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "team budget budget.monthly_usd $1" in refused.stderr
    assert f"spent ${spent.quantize(cents, rounding='ROUND_DOWN')} this month" in refused.stderr
    assert_nothing_provisioned(bob_home)
