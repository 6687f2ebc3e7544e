"""An index on `job.created_at`: the list views read the newest jobs first (`orch status`,
`orch cost`, their `--limit` and `--since`), which without it sorts every job of the ledger.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEX = "ix_job_created_at"


def upgrade() -> None:
    # Only when missing, as in 0002 (a ledger adopted without its stamp).
    if INDEX not in {index["name"] for index in sa.inspect(op.get_bind()).get_indexes("job")}:
        op.create_index(INDEX, "job", ["created_at"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="job")
