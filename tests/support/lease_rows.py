"""Rows for tests of controller leases on a shared ledger: a bare job (`add_job`), and a
lease made to look last renewed a while ago by the ledger's clock (`age_lease`)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import ControllerLease, Job, Ledger, utcnow


def add_job(ledger: Ledger, job_id: str, **fields: object) -> Job:
    """A one-node job of the local provider, created 5 minutes ago unless `fields` say."""
    fields.setdefault("created_at", utcnow() - timedelta(minutes=5))
    return ledger.add_job(
        Job(id=job_id, name="j", provider="local", nodes=1, gpus_per_node=0, spec_json="{}",
            spec_path="job.yaml", **fields)
    )  # fmt: skip


def age_lease(ledger: Ledger, job_id: str, seconds: float, *, length_s: float = 30) -> None:
    """Make job `job_id`'s lease last renewed `seconds` ago by the ledger's clock, for
    `length_s` (as if its holder stopped renewing it then)."""
    renewed = ControllerLeases(ledger).now() - timedelta(seconds=seconds)
    table = ControllerLease.__table__  # type: ignore[attr-defined]
    with ledger.engine.begin() as connection:
        connection.execute(
            update(table).where(table.c.job_id == job_id).values(
                renewed_at=renewed, expires_at=renewed + timedelta(seconds=length_s)
            )
        )  # fmt: skip
