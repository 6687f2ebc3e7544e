"""Revision 0004 on a ledger in use, SQLite and PostgreSQL: a ledger at 0003 with kept
clusters, jobs and a controller lease opens at head with its rows intact; each cluster gets
the machine of its newest job's controller ("machine:pid", as a shared ledger records it) as
its owner, and the leases' new columns are empty."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.database import database_url
from orchestrator.ledger.migrate import alembic_config
from orchestrator.ledger.store import Ledger, make_engine
from tests.unit.ledger.test_ledger_migrations import schema_differences

JOB = (
    "INSERT INTO job (id, name, state, provider, nodes, gpus_per_node, spec_json, spec_path,"
    " created_at, recoveries, switches, controller, cluster_id) VALUES (:id, 'j', 'SUCCEEDED',"
    " 'local', 1, 1, '{}', 'job.yaml', :at, 0, 0, :controller, :cluster)"
)
CLUSTER = (
    "INSERT INTO kept_cluster (id, name, provider, state, nodes, gpus_per_node, created_at)"
    " VALUES (:id, 'dev', 'local', 'UP', 1, 1, '2026-01-01T00:00:00+00:00')"
)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


def ledger_at_0003(url: str) -> None:
    """A ledger migrated to 0003 (by the orch before 0004), with rows in use."""
    from alembic import command

    engine = create_engine(database_url(url))
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0003")
        for cluster in ("dev-a1", "dev-b2", "dev-c3"):
            connection.execute(text(CLUSTER), {"id": cluster})
        for job, at, controller, cluster in (
            ("old-1", "2026-01-01T01:00:00+00:00", "laptop-1a2b:10", "dev-a1"),
            ("old-2", "2026-01-01T02:00:00+00:00", "desk-3c4d:20", "dev-a1"),  # the newest
            ("old-3", "2026-01-01T03:00:00+00:00", None, "dev-b2"),  # no controller recorded
            ("live", "2026-01-01T04:00:00+00:00", "desk-3c4d:21", None),
        ):
            connection.execute(
                text(JOB), {"id": job, "at": at, "controller": controller, "cluster": cluster}
            )
        connection.execute(
            text(
                "INSERT INTO controller_lease (job_id, holder, machine, renewed_at, expires_at)"
                " VALUES ('live', 'desk-3c4d:21', 'desk-3c4d', '2026-01-01T04:00:00+00:00',"
                " '2026-01-01T04:00:30+00:00')"
            )
        )
    engine.dispose()


def test_a_ledger_at_0003_gains_owners_and_cancel_requests_with_its_rows_intact(url: str) -> None:
    ledger_at_0003(url)
    engine = make_engine(url)
    try:
        clusters = Clusters(Ledger(engine))
        owners = {c.id: c.machine for c in clusters.all()}
        assert owners == {"dev-a1": "desk-3c4d", "dev-b2": None, "dev-c3": None}
        assert clusters.up("dev", machine="desk-3c4d").id == "dev-a1"  # type: ignore[union-attr]
        assert clusters.up("dev", machine="laptop-1a2b") is None
        lease = ControllerLeases(Ledger(engine)).get("live")
        assert lease is not None and (lease.holder, lease.machine) == ("desk-3c4d:21", "desk-3c4d")
        assert (lease.taken_at, lease.cancel_by, lease.cancel_at) == (None, None, None)
        assert lease.expires_at.isoformat() == "2026-01-01T04:00:30+00:00"
        assert schema_differences(engine) == []
    finally:
        engine.dispose()
