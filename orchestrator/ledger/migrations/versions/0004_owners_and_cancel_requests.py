"""A shared ledger's owners: the machine that owns each kept cluster, and a cancel asked of a
job's controller through its lease.

- `kept_cluster.machine`: the machine id of the ORCH_HOME that made the cluster; names are
  scoped by it. A cluster made before is given the machine of its newest job's controller
  ("machine:pid") where that names one, else stays NULL (no machine's).
- `controller_lease.taken_at`: when the holder took the lease; NULL for leases taken before.
- `controller_lease.cancel_by`, `cancel_at`: a cancel another machine asked of the holder.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.types import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _columns(table: str) -> set[str]:
    return {column["name"] for column in sa.inspect(op.get_bind()).get_columns(table)}


def upgrade() -> None:
    # Each part only when missing, as in 0002 (a ledger adopted without its stamp).
    if "machine" not in _columns("kept_cluster"):
        with op.batch_alter_table("kept_cluster") as batch:
            batch.add_column(sa.Column("machine", sa.String(), nullable=True))
            batch.create_index("ix_kept_cluster_machine", ["machine"])
        _owners_of_existing_clusters()
    present = _columns("controller_lease")
    missing = [
        sa.Column(name, kind, nullable=True)
        for name, kind in (
            ("taken_at", UTCDateTime()),
            ("cancel_by", sa.String()),
            ("cancel_at", UTCDateTime()),
        )
        if name not in present
    ]
    if missing:
        with op.batch_alter_table("controller_lease") as batch:
            for column in missing:
                batch.add_column(column)


def _owners_of_existing_clusters() -> None:
    """Each cluster's machine: that of its newest job's controller, when it names one."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT kept_cluster.id, job.controller FROM kept_cluster JOIN job"
            " ON job.cluster_id = kept_cluster.id ORDER BY job.created_at"
        )
    ).all()
    newest = {cluster_id: controller for cluster_id, controller in rows}  # the last one wins
    for cluster_id, controller in newest.items():
        if controller and ":" in controller:
            bind.execute(
                sa.text("UPDATE kept_cluster SET machine = :machine WHERE id = :id"),
                {"machine": controller.rsplit(":", 1)[0], "id": cluster_id},
            )


def downgrade() -> None:
    with op.batch_alter_table("controller_lease") as batch:
        for name in ("cancel_at", "cancel_by", "taken_at"):
            batch.drop_column(name)
    with op.batch_alter_table("kept_cluster") as batch:
        batch.drop_index("ix_kept_cluster_machine")
        batch.drop_column("machine")
