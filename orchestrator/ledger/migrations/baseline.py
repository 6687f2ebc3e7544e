"""The ledger's schema as revision 0001 creates it: the tables and columns of the last orch
that created and widened its ledgers itself, before migrations. Frozen: later revisions change
the schema, never this file. (One widening over those ledgers: `checkpoint.size_bytes` is a
BIGINT, which SQLite stores as the same 64-bit integer; PostgreSQL's INTEGER would stop at
2 GiB.)

Ledgers made before migrations (no `alembic_version` table) are brought to exactly this
schema by `orchestrator.ledger.migrate` (missing tables created, missing columns added with
the defaults given here), stamped 0001, then upgraded like any other.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
)

from orchestrator.ledger.types import DecimalText, UTCDateTime


def _when(name: str, nullable: bool = True) -> Column:
    return Column(name, UTCDateTime(), nullable=nullable)


def _str(name: str, nullable: bool = True, **kw: object) -> Column:
    return Column(name, String(), nullable=nullable, **kw)  # type: ignore[arg-type]


def _int(name: str, nullable: bool = True, **kw: object) -> Column:
    return Column(name, Integer(), nullable=nullable, **kw)  # type: ignore[arg-type]


def _float(name: str) -> Column:
    return Column(name, Float(), nullable=True)


def _job_id(target: str = "job.id", name: str = "job_id") -> Column:
    return Column(name, String(), ForeignKey(target), nullable=False, index=True)


def _serial() -> Column:
    return Column("id", Integer(), primary_key=True)


def baseline_metadata() -> MetaData:
    """The tables of revision 0001, in a MetaData of their own (never the models')."""
    metadata = MetaData()
    Table(
        "job", metadata,
        _str("id", False, primary_key=True), _str("name", False), _str("state", False, index=True,
        default="PENDING"), _str("provider", False), _int("nodes", False),
        _int("gpus_per_node", False), _str("spec_json", False), _str("spec_path", False),
        _when("created_at", False), _when("started_at"), _when("ended_at"), _int("step"),
        _float("loss"), _int("exit_code"), _str("reason"), _int("recoveries", False, default=0),
        _int("switches", False, default=0), _str("policy_state"), _str("controller"),
        _str("stop_state"), _str("identity"), _str("cluster_id", index=True),
    )  # fmt: skip
    Table(
        "kept_cluster", metadata,
        _str("id", False, primary_key=True), _str("name", False, index=True),
        _str("provider", False), _str("state", False, default="UP"), _int("nodes", False),
        _int("gpus_per_node", False),
        _float("autostop_s"), _when("created_at", False), _when("ended_at"), _str("job_id"),
        _when("idle_since"), _str("reason"),
    )  # fmt: skip
    Table(
        "ledger_meta", metadata,
        _str("key", False, primary_key=True), _str("value", False),
    )  # fmt: skip
    Table(
        "checkpoint", metadata,
        _serial(), _job_id(), _str("name", False), _int("step"),
        Column("size_bytes", BigInteger(), nullable=False), _when("pulled_at", False),
        _str("kind"), _str("digest"),
        Column("in_mirror", Boolean(), nullable=False, default=True), _when("stored_at"),
        _str("store_url"), _str("files_json"), _when("pruned_at"),
    )  # fmt: skip
    Table(
        "event", metadata,
        _serial(), _job_id(), _when("at", False), _str("kind", False),
        _str("message", False, default=""), _int("step"),
    )  # fmt: skip
    Table(
        "gpu_sample", metadata,
        _serial(), _job_id(), _int("rank", False), _int("gpu", False), _when("at", False),
        _float("util_pct"), _float("mem_used_mib"), _float("mem_total_mib"),
        Column("ok", Boolean(), nullable=False, default=True),
    )  # fmt: skip
    Table(
        "idle_lease", metadata,
        _serial(), _job_id("kept_cluster.id", "cluster_id"),
        _str("instance_id", False, index=True), _int("rank", False),
        Column("price_per_hour", DecimalText(), nullable=False), _when("launched_at", False),
        _when("ended_at"),
    )  # fmt: skip
    Table(
        "lease", metadata,
        _serial(), _job_id(), _str("cluster", False), _str("provider", False),
        _str("instance_id", False, index=True), _int("rank", False), _str("market", False),
        _str("instance_type", False), Column("price_per_hour", DecimalText(), nullable=False),
        _when("launched_at", False), _when("ended_at"), _str("identity"),
    )  # fmt: skip
    Table(
        "progress_sample", metadata,
        _serial(), _job_id(), _when("at", False), _int("step", False), _float("epoch"),
        _float("loss"), _float("lr"), _float("img_s"),
    )  # fmt: skip
    return metadata
