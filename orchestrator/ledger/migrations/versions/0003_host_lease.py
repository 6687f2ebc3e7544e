"""Controller hosts: `host_lease`, a launched controller host's billable life, its own line of
the bill (no job's).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.types import DecimalText, UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("host_lease"):
        return
    op.create_table(
        "host_lease",
        sa.Column("instance_id", sa.String(), primary_key=True),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("price_per_hour", DecimalText(), nullable=False),
        sa.Column("launched_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("host_lease")
