from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.errors import UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine
from orchestrator.report.documents import cost_document, job_document

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_job(ledger: Ledger, job_id: str = "j-1") -> Job:
    return ledger.add_job(
        Job(
            id=job_id, name="j", provider="local", nodes=2, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=T0,
        )
    )  # fmt: skip


def lease(job_id: str, instance: str, price: str, start: datetime, end: datetime | None) -> Lease:
    return Lease(
        job_id=job_id, cluster=job_id, provider="local", instance_id=instance, rank=0,
        market="spot", instance_type="local-1x", price_per_hour=Decimal(price),
        launched_at=start, ended_at=end,
    )  # fmt: skip


def test_spend_is_seconds_times_recorded_price_exactly(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    make_job(ledger)
    ledger.open_lease(lease("j-1", "a", "0.36", T0, T0 + timedelta(seconds=100)))
    ledger.open_lease(lease("j-1", "b", "1.20", T0, None))
    now = T0 + timedelta(seconds=30)
    # a: 100 s x 0.36 / 3600 = 0.01; b: 30 s x 1.20 / 3600 = 0.01
    assert ledger.spend("j-1", now) == Decimal("0.02")
    closed = ledger.close_leases(["b", "missing"], T0 + timedelta(seconds=60))
    assert closed == 1
    assert ledger.spend("j-1", now + timedelta(hours=5)) == Decimal("0.03")
    again = Ledger(make_engine(tmp_path / "orch.db"))  # survives a reopen, still exact
    assert again.leases("j-1")[0].price_per_hour == Decimal("0.36")
    assert again.leases("j-1")[1].ended_at == T0 + timedelta(seconds=60)


def test_unknown_job_is_a_user_error() -> None:
    ledger = Ledger(make_engine(":memory:"))
    with pytest.raises(UnknownJob) as info:
        ledger.get_job("nope")
    assert info.value.exit_code == 2


def test_documents_carry_the_contract_fields(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(":memory:"))
    make_job(ledger)
    ledger.open_lease(lease("j-1", "a", "3.6", T0, T0 + timedelta(seconds=10)))
    ledger.update_job("j-1", state=JobState.SUCCEEDED, step=40)
    doc = job_document(ledger, Settings(home=tmp_path), ledger.get_job("j-1"))
    for key in ("id", "state", "provider", "nodes", "gpus_per_node", "step", "spend_usd",
                "checkpoints", "recoveries"):  # fmt: skip
        assert key in doc
    assert doc["state"] == "SUCCEEDED" and doc["step"] == 40
    assert doc["spend_usd"] == pytest.approx(0.01)
    assert doc["leases"][0]["ended_at"] is not None
    cost = cost_document(ledger)
    assert cost["total_usd"] == pytest.approx(0.01) and cost["jobs"][0]["running"] is False


def test_an_older_ledger_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "orch.db"
    with sqlite3.connect(path) as db:  # a job table from before `loss` and `stop_state`
        db.execute(
            "CREATE TABLE job (id VARCHAR PRIMARY KEY, name VARCHAR, state VARCHAR, "
            "provider VARCHAR, nodes INTEGER, gpus_per_node INTEGER, spec_json VARCHAR, "
            "spec_path VARCHAR, created_at VARCHAR, started_at VARCHAR, ended_at VARCHAR, "
            "step INTEGER, exit_code INTEGER, reason VARCHAR, recoveries INTEGER, "
            "controller VARCHAR)"
        )
        db.execute(
            "INSERT INTO job VALUES ('old', 'old', 'SUCCEEDED', 'local', 1, 1, '{}', 'x', "
            "'2026-01-01T00:00:00+00:00', NULL, NULL, 5, 0, NULL, 0, NULL)"
        )
    ledger = Ledger(make_engine(path))
    job = ledger.get_job("old")
    assert job.step == 5 and job.loss is None and job.stop_state is None
    ledger.update_job("old", loss=0.5)
    assert ledger.get_job("old").loss == 0.5


def _job_columns(path: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return {row[1] for row in db.execute("PRAGMA table_info(job)")}


def _revision(path: Path) -> list[tuple[str]]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchall()


def test_the_schema_is_migrated_once_then_trusted_until_its_revision_changes(
    tmp_path: Path,
) -> None:
    import sqlite3

    from orchestrator.ledger.migrations import HEAD

    path = tmp_path / "orch.db"
    make_engine(path).dispose()  # a new ledger: migrated to the newest revision
    assert _revision(path) == [(HEAD,)]
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE job DROP COLUMN identity")  # behind orch's back
    make_engine(path).dispose()
    assert "identity" not in _job_columns(path)  # a ledger at head is not inspected again
    with sqlite3.connect(path) as db:  # as if made before migrations
        db.execute("DROP TABLE alembic_version")
    make_engine(path).dispose()
    assert "identity" in _job_columns(path)
    assert _revision(path) == [(HEAD,)]
