"""`orch status` and `orch cost` on a ledger of many jobs: status lists the newest 50 and every
older unfinished job, and says how many finished ones it left out; cost's table has a row for
each of the newest 50 and one summing the older, `--all` a row each, and its JSON every job."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cli import context
from orchestrator.job_state import JobState
from orchestrator.ledger import measures, store
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine
from orchestrator.report import documents
from tests.support.in_process import isolated_home, run_main

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=100)  # every document is read at this instant
FINISHED = 55


@pytest.fixture
def many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """55 finished one-node jobs, an hour apart, each with a 1 h lease at $0.50, and one
    RUNNING job older than all of them (its lease still open)."""
    home = isolated_home(tmp_path, monkeypatch)
    for module in (documents, measures, store):
        monkeypatch.setattr(module, "utcnow", lambda: NOW)
    ledger = Ledger(make_engine(home / "orch.db"))
    for n in range(-1, FINISHED):
        job_id = f"job-{n + 1:03d}"
        created = T0 + timedelta(hours=n)
        running = n == -1
        ledger.add_job(
            Job(
                id=job_id, name="j", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
                spec_path="job.yaml", created_at=created,
                state=JobState.RUNNING if running else JobState.SUCCEEDED,
            )
        )  # fmt: skip
        ledger.open_lease(
            Lease(
                job_id=job_id, cluster=job_id, provider="local", instance_id=f"i-{job_id}",
                rank=0, market="on-demand", instance_type="local", price_per_hour=Decimal("0.5"),
                launched_at=created, ended_at=None if running else created + timedelta(hours=1),
            )
        )  # fmt: skip
    return ledger


@pytest.mark.parametrize("through_view", [True, False])
def test_status_lists_the_newest_and_every_unfinished_job(
    many: Ledger, monkeypatch: pytest.MonkeyPatch, through_view: bool
) -> None:
    if not through_view:
        monkeypatch.setattr(context, "ledger_view", lambda: None)
    code, out, err = run_main(["status", "--json"])
    assert code == 0, err
    ids = [job["id"] for job in json.loads(out)["jobs"]]
    assert ids[:50] == [f"job-{n:03d}" for n in range(FINISHED, FINISHED - 50, -1)]
    assert ids[50:] == ["job-000"]  # older than all, but still running
    code, out, err = run_main(["status"])
    assert code == 0, err
    assert "5 older finished job(s) not listed" in out
    assert "job-000" in out and "job-005" not in out


def test_status_says_nothing_of_hidden_jobs_when_none_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolated_home(tmp_path, monkeypatch)
    code, out, err = run_main(["status"])
    assert code == 0, err
    assert "not listed" not in out


def _row(out: str, first_cell: str) -> list[str]:
    line = next(line for line in out.splitlines() if first_cell in line)
    return [cell.strip() for cell in re.split(r"[│|]", line) if cell.strip()]


@pytest.mark.parametrize("through_view", [True, False])
def test_cost_sums_the_older_jobs_in_one_row_and_lists_all_with_all(
    many: Ledger, monkeypatch: pytest.MonkeyPatch, through_view: bool
) -> None:
    if not through_view:
        monkeypatch.setattr(context, "ledger_view", lambda: None)
    code, out, err = run_main(["cost"])
    assert code == 0, err
    older = _row(out, "older job(s)")
    assert older[0].startswith("6 older job(s)")
    # the 5 oldest finished jobs (1 h at $0.50 each) and the running one (101 h so far)
    assert older[1:] == ["6", "106.0000", "$53.0000"]
    assert "job-005" not in out and "job-006" in out
    code, every, err = run_main(["cost", "--all"])
    assert code == 0, err
    assert "older job(s)" not in every and "job-001" in every and "job-055" in every
    assert _row(out, "total") == _row(every, "total")
    code, document, err = run_main(["cost", "--json"])
    assert code == 0, err
    assert len(json.loads(document)["jobs"]) == FINISHED + 1
