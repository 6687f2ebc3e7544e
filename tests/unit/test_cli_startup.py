"""Building the command line imports none of the heavy parts: `orch --help`, `--version` and
shell completion start without the ledger (SQLModel), SSH (paramiko), the cloud (boto3), the
configuration's models or matplotlib; nor do the list views (`orch status`, `orch cost`) on a
ledger whose schema is current. The timings are in bench/cli_startup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "sqlmodel", "paramiko", "boto3", "matplotlib", "orchestrator.config")


def no_orch_variables() -> dict[str, str]:
    """This process's environment without ORCH_* variables (a given setting is checked, which
    loads the settings' models: `cli.context.check_settings`)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("ORCH_")}


def imported_after(code: str, heavy: tuple[str, ...] = HEAVY, **env: str) -> list[str]:
    """Which of `heavy` a fresh interpreter holds after running `code`."""
    report = f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\n{report}"],
        capture_output=True, text=True, check=True,
        env={**no_orch_variables(), "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_building_the_app_imports_no_heavy_part() -> None:
    code = "import typer\nfrom orchestrator.cli.app import app\ntyper.main.get_command(app)"
    # pydantic too (the spec's values): typer itself imports it only to run a command
    assert imported_after(code, (*HEAVY, "pydantic")) == []


def test_help_of_a_command_opens_no_ledger(tmp_path: Path) -> None:
    home = tmp_path / "home"
    code = (
        "import sys\nfrom orchestrator.cli.app import app\n"
        "sys.argv = ['orch', 'status', '--help']\n"
        "try:\n    app()\nexcept SystemExit:\n    pass"
    )
    assert imported_after(code, ORCH_HOME=str(home)) == []
    assert not home.exists()  # nothing was created under ORCH_HOME either


def run_orch(*argv: str) -> str:
    """Code that runs `orch ARGV` in the interpreter `imported_after` starts."""
    return (
        f"import sys\nfrom orchestrator.cli.app import main\nsys.argv = ['orch', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code"
    )


def test_the_list_views_read_the_ledger_without_sqlmodel_or_the_settings(tmp_path: Path) -> None:
    """`orch status` (all jobs) and `orch cost` read the ledger's sqlite3 view when its schema
    is current (tests/unit/ledger/test_ledger_view.py holds it to the SQLModel path)."""
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from orchestrator.ledger.clusters import Clusters
    from orchestrator.ledger.store import Job, Lease, Ledger, make_engine

    home = tmp_path / "home"
    ledger = Ledger(make_engine(home / "orch.db"))
    now = datetime.now(UTC)
    for n, state in enumerate(("SUCCEEDED", "RUNNING")):
        ledger.add_job(
            Job(
                id=f"j-{n}", name="j", state=state, provider="local", nodes=1, gpus_per_node=1,
                spec_json="{}", spec_path="job.yaml", created_at=now - timedelta(minutes=n),
            )
        )  # fmt: skip
        ledger.open_lease(
            Lease(
                job_id=f"j-{n}", cluster=f"j-{n}", provider="local", instance_id=f"i-{n}",
                rank=0, market="spot", instance_type="local", price_per_hour=Decimal("0.5"),
                launched_at=now - timedelta(minutes=n),
            )
        )  # fmt: skip
    clusters = Clusters(ledger)
    kept = clusters.create(
        "dev", provider="local", nodes=1, gpus_per_node=1, autostop_s=3600.0, now=now
    )
    clusters.release(kept.id, [("i-k", 0, Decimal("0.5"))], now)
    for argv in (["status"], ["status", "--json"], ["cost"], ["cost", "--job", "j-1"]):
        assert imported_after(run_orch(*argv), ORCH_HOME=str(home)) == [], argv


def test_the_list_views_of_a_new_home_create_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for argv in (["status"], ["cost", "--json"]):
        assert imported_after(run_orch(*argv), ORCH_HOME=str(home)) == [], argv
    assert not home.exists()
