"""The ledger check finds each broken invariant, and a damaged file, and passes a good ledger."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.job_state import JobState
from orchestrator.ledger.check import check_ledger
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine, utcnow

T0 = utcnow()


def _ledger(path: Path) -> Ledger:
    ledger = Ledger(make_engine(path))
    for job_id, state in (("done", JobState.SUCCEEDED), ("live", JobState.RUNNING)):
        final = state is JobState.SUCCEEDED
        ledger.add_job(
            Job(id=job_id, name="j", state=state, provider="local", nodes=1, gpus_per_node=1,
                spec_json="{}", spec_path="job.yaml", created_at=T0,
                started_at=T0 + timedelta(seconds=1),
                ended_at=T0 + timedelta(seconds=9) if final else None,
                exit_code=0 if final else None)
        )  # fmt: skip
        ledger.open_lease(
            Lease(job_id=job_id, cluster=job_id, provider="local", instance_id=f"i-{job_id}",
                  rank=0, market="on-demand", instance_type="local-1x",
                  price_per_hour=Decimal("0.5"), launched_at=T0)
        )  # fmt: skip
    ledger.close_leases(["i-done"], T0 + timedelta(seconds=8))
    ledger.engine.dispose()
    return ledger


def _sql(path: Path, statement: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute(statement)


def test_a_consistent_ledger_passes(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    _ledger(path)
    result = check_ledger(path)
    assert result.ok, str(result)
    assert str(result) == "ledger ok"
    # An open lease of a running job is fine, unless nobody watches that job.
    unwatched = check_ledger(path, watched=lambda job_id: False)
    assert unwatched.problems == [
        "lease 2 (i-live of job live): open, but no live controller watches job live"
    ]
    assert check_ledger(path, watched=lambda job_id: job_id == "live").ok


T_BEFORE = (T0 - timedelta(hours=1)).isoformat()

BROKEN = {
    "final job with an open lease": (
        "UPDATE lease SET ended_at = NULL WHERE instance_id = 'i-done'",
        "lease 1 (i-done of job done): still open although the job is SUCCEEDED",
    ),
    "lease ending before its launch": (
        f"UPDATE lease SET ended_at = '{T_BEFORE}' WHERE instance_id = 'i-done'",
        "lease 1 (i-done of job done): ended",
    ),
    "two open leases of one instance": (
        "INSERT INTO lease (job_id, cluster, provider, instance_id, rank, market, instance_type,"
        f" price_per_hour, launched_at) VALUES ('live', 'live', 'local', 'i-live', 1, 'spot',"
        f" 'x', '0.1', '{T0.isoformat()}')",
        "instance i-live: 2 open leases [2, 3]",
    ),
    "lease of a job that does not exist": (
        "UPDATE lease SET job_id = 'ghost' WHERE id = 1",
        "lease row 1 refers to a missing job",
    ),
    "negative price": ("UPDATE lease SET price_per_hour = '-1' WHERE id = 1", "is not a price"),
    "garbage price": ("UPDATE lease SET price_per_hour = 'lots' WHERE id = 1", "unreadable price"),
    "garbage time": ("UPDATE lease SET launched_at = 'soon' WHERE id = 1", "unreadable launch"),
    "unknown state": ("UPDATE job SET state = 'HALF' WHERE id = 'live'", "unknown state 'HALF'"),
    "final job without an end": (
        "UPDATE job SET ended_at = NULL WHERE id = 'done'",
        "job done: SUCCEEDED without an end time",
    ),
    "final job without an exit code": (
        "UPDATE job SET exit_code = NULL WHERE id = 'done'",
        "job done: SUCCEEDED without an exit code",
    ),
    "stopping without a destination": (
        "UPDATE job SET state = 'STOPPING', stop_state = NULL WHERE id = 'live'",
        "job live: STOPPING without the state it stops into",
    ),
    "started before created": (
        f"UPDATE job SET started_at = '{T_BEFORE}' WHERE id = 'live'",
        "job live: started",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_invariant_is_found(tmp_path: Path, case: str) -> None:
    path = tmp_path / "orch.db"
    _ledger(path)
    statement, expected = BROKEN[case]
    _sql(path, statement)
    result = check_ledger(path)
    assert not result.ok
    findings = "\n".join(result.integrity + result.problems)
    assert expected in findings, findings
    assert "ledger inconsistent" in str(result)


def test_a_damaged_file_fails_the_integrity_check(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    ledger = _ledger(path)
    ledger.add_event("live", "NOISE", "n" * 50_000)  # spread the tables over many pages
    ledger.engine.dispose()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page + 8 : 2 * page + 600] = b"\xa5" * 592  # the header of an inner page
    path.write_bytes(bytes(data))
    result = check_ledger(path)
    assert not result.ok
    assert result.integrity or result.problems


def test_no_file_is_an_error_not_a_new_ledger(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check_ledger(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
