"""When `spot: auto` chose spot, the dry run and the bill say so, with the price and how far
below on-demand it is: with `ORCH_LOCAL_PRICE_PER_HOUR=0.5` a local node bills a third of that
(the local spot price), and the user reads why where the price shows. Through the console
entry point, in this process."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine
from tests.support.in_process import isolated_home, run_main
from tests.support.ledger_rows import at

CHOSE = "spot: auto chose spot at $0.166667/node-hour, 67% below on-demand ($0.5/node-hour)"
BILLED = (
    "spot: auto chose spot for 2 of the 2 node(s) launched, at $0.166667/node-hour, "
    "67% below on-demand ($0.5/node-hour)"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = isolated_home(tmp_path, monkeypatch)
    monkeypatch.setenv("ORCH_LOCAL_PRICE_PER_HOUR", "0.5")
    monkeypatch.setenv("COLUMNS", "300")
    return home


def spec_file(tmp_path: Path, spot: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / f"job-{spot}.yaml"
    path.write_text(
        f"name: cheap\nworkdir: .\nrun: python train.py\n"
        f"resources: {{nodes: 2, gpus_per_node: 1, spot: {spot}}}\n"
    )
    return path


def test_the_dry_run_says_spot_auto_chose_spot_and_its_discount(home: Path, tmp_path: Path) -> None:
    code, out, err = run_main(["submit", str(spec_file(tmp_path, "auto")), "--dry-run"])
    assert code == 0, out + err
    assert "at $0.166667/node-hour" in out.splitlines()[0]
    assert any(line.strip().startswith(CHOSE) for line in out.splitlines()), out
    code, out, err = run_main(["submit", str(spec_file(tmp_path, "auto")), "--dry-run", "--json"])
    assert any(note.startswith(CHOSE) for note in json.loads(out)["plan"]["notes"])
    # Asked for spot, or for on-demand: nothing was chosen for the user, nothing to say.
    for spot in ("true", "false"):
        code, out, err = run_main(["submit", str(spec_file(tmp_path, spot)), "--dry-run"])
        assert code == 0 and "spot: auto" not in out, out + err


def billed_job(job_id: str, spot: object) -> None:
    ledger = Ledger(make_engine(load_settings().db_path))
    ledger.add_job(
        Job(
            id=job_id, name="cheap", state=JobState.SUCCEEDED, provider="local", nodes=2,
            gpus_per_node=1, spec_json=json.dumps({"resources": {"spot": spot}}),
            spec_path="job.yaml", created_at=at(0), started_at=at(5), ended_at=at(3605),
        )
    )  # fmt: skip
    for rank in (0, 1):
        ledger.open_lease(
            Lease(
                job_id=job_id, cluster=job_id, provider="local", instance_id=f"l-{job_id}{rank}",
                rank=rank, market="spot", instance_type="local-1x",
                price_per_hour=Decimal("0.166667"), launched_at=at(5), ended_at=at(3605),
            )
        )  # fmt: skip


def test_the_bill_says_spot_auto_chose_spot_and_its_discount(home: Path) -> None:
    billed_job("cheap-1", "auto")
    code, out, err = run_main(["cost", "--job", "cheap-1"])
    assert code == 0, out + err
    assert "$0.3333" in out and BILLED in " ".join(out.split()), out
    code, out, err = run_main(["cost", "--job", "cheap-1", "--json"])
    choice = json.loads(out)["spot_auto"]
    assert choice["discount_pct"] == 67 and choice["on_demand_price_per_node_hour"] == "0.5"
    assert choice["nodes"] == 2 and choice["price_per_node_hour"] == "0.166667"

    billed_job("asked-1", True)  # spot because the spec said so: no choice to explain
    code, out, err = run_main(["cost", "--job", "asked-1", "--json"])
    assert code == 0 and json.loads(out)["spot_auto"] is None, out + err
