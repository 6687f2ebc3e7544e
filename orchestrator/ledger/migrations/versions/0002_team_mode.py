"""Team mode: each job's owner label, and the controller lease of a shared ledger.

- `job.owner`: the owner label of whoever submitted the job (config `owner`, else the login
  name), the key of the per-user monthly budget; NULL for jobs submitted before.
- `controller_lease`: on a ledger that several machines share, the one controller allowed to
  drive a job holds its row until `expires_at`, renewing it on every heartbeat.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.types import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Each part only when missing: a ledger whose version stamp was lost is adopted as a
    # baseline ledger, and may hold them already.
    schema = sa.inspect(op.get_bind())
    if "owner" not in {column["name"] for column in schema.get_columns("job")}:
        with op.batch_alter_table("job") as batch:
            batch.add_column(sa.Column("owner", sa.String(), nullable=True))
            batch.create_index("ix_job_owner", ["owner"])
    if schema.has_table("controller_lease"):
        return
    op.create_table(
        "controller_lease",
        sa.Column("job_id", sa.String(), sa.ForeignKey("job.id"), primary_key=True),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("machine", sa.String(), nullable=False),
        sa.Column("renewed_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("controller_lease")
    with op.batch_alter_table("job") as batch:
        batch.drop_index("ix_job_owner")
        batch.drop_column("owner")
