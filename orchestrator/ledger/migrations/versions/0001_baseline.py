"""The ledger's tables as orch created them before migrations.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

from orchestrator.ledger.migrations.baseline import baseline_metadata

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    baseline_metadata().create_all(op.get_bind())


def downgrade() -> None:
    baseline_metadata().drop_all(op.get_bind())
