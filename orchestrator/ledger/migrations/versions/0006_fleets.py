"""Fleets of the user's own machines (`orchestrator.ledger.fleets`): `fleet`, its hosts
(`fleet_host`, UNIQUE on (address, port): a machine is in one fleet at most), the slots jobs
hold (`fleet_claim`, with a UNIQUE index on (host_id, slot) over the claims not released: two
held claims of one slot cannot exist) and the jobs waiting for slots (`fleet_waiter`).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.types import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

HELD = sa.text("released_at IS NULL")
TABLES = ("fleet_waiter", "fleet_claim", "fleet_host", "fleet")  # the dependent ones first


def _str(name: str, nullable: bool = False, **kw: object) -> sa.Column:
    return sa.Column(name, sa.String(), nullable=nullable, **kw)  # type: ignore[arg-type]


def _int(name: str, **kw: object) -> sa.Column:
    return sa.Column(name, sa.Integer(), nullable=False, **kw)  # type: ignore[arg-type]


def _when(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, UTCDateTime(), nullable=nullable)


def upgrade() -> None:
    # Only when missing, as in 0003 (a ledger adopted without its stamp).
    if sa.inspect(op.get_bind()).has_table("fleet"):
        return
    op.create_table(
        "fleet",
        _str("name", primary_key=True),
        _str("identity"),
        _str("known_hosts", nullable=True),
        _str("price_per_hour"),
        _str("price_unit"),
        _str("owner"),
        _when("created_at"),
    )
    op.create_table(
        "fleet_host",
        _int("id", primary_key=True),
        _str("fleet"),
        _int("position"),
        _str("user"),
        _str("address"),
        _int("port"),
        _str("proxy_jump", nullable=True),
        _str("host_key"),
        _str("gpus"),
        _int("cpus"),
        _int("memory_mib"),
        sa.Column("disk_free_gb", sa.Float(), nullable=False),
        _str("python", nullable=True),
        _str("torch", nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        _str("health_note"),
        _when("checked_at"),
        sa.ForeignKeyConstraint(["fleet"], ["fleet.name"]),
    )
    op.create_index("ix_fleet_host_fleet", "fleet_host", ["fleet"])
    op.create_index("uq_fleet_host_address", "fleet_host", ["address", "port"], unique=True)
    op.create_table(
        "fleet_claim",
        _int("id", primary_key=True),
        _int("host_id"),
        _int("slot"),
        _str("job_id"),
        _int("rank"),
        _str("instance_id"),
        _str("owner"),
        _when("claimed_at"),
        _when("released_at", nullable=True),
        sa.Column("detail", sa.Text(), nullable=False, server_default=""),
        sa.ForeignKeyConstraint(["host_id"], ["fleet_host.id"]),
    )
    for column in ("host_id", "job_id", "instance_id"):
        op.create_index(f"ix_fleet_claim_{column}", "fleet_claim", [column])
    op.create_index(
        "uq_fleet_claim_held_slot", "fleet_claim", ["host_id", "slot"], unique=True,
        sqlite_where=HELD, postgresql_where=HELD,
    )  # fmt: skip
    op.create_table(
        "fleet_waiter",
        _str("job_id", primary_key=True),
        _str("fleet"),
        _int("nodes"),
        _int("slots_per_node"),
        _str("owner"),
        _when("since"),
        sa.ForeignKeyConstraint(["fleet"], ["fleet.name"]),
    )
    op.create_index("ix_fleet_waiter_fleet", "fleet_waiter", ["fleet"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_table(table)
