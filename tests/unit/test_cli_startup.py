"""Building the command line imports none of the heavy parts: `orch --help`, `--version` and
shell completion start without the ledger (SQLModel), SSH (paramiko), the cloud (boto3), the
configuration's models or matplotlib. The timings are in bench/cli_startup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "sqlmodel", "paramiko", "boto3", "matplotlib", "orchestrator.config")


def imported_after(code: str, heavy: tuple[str, ...] = HEAVY, **env: str) -> list[str]:
    """Which of `heavy` a fresh interpreter holds after running `code`."""
    report = f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\n{report}"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
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
