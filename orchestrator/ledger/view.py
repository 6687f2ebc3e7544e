"""A read-only view of the ledger for the list views: through the stdlib sqlite3 module for
the SQLite file, through SQLAlchemy Core for a ledger in another database.

`orch status` (all jobs, human or --json) and `orch cost` read a few tables and print; through
SQLModel and SQLAlchemy their start-up would be mostly imports. This view reads the same
tables with sqlite3 alone. A ledger in PostgreSQL (`ledger.url`) is read by `EngineView`, the
same reads as plain typed rows (no ORM objects): `orch cost` over ten thousand jobs then costs
two queries and no object per row.

Contract:
- Read only: the file is opened with `mode=ro`, and all reads of one view see one snapshot
  (one read transaction). It never creates, checks or migrates anything.
- Only a ledger this orch would open as is: `open_view` returns None (the caller then takes
  the full path, `store.make_engine`, which migrates or reports the problem) unless the file
  is a SQLite database stamped with this orch's newest schema revision (`alembic_version`
  holds `SCHEMA_REVISION`, `migrations.HEAD`). `LAYOUT` lists the models' tables and columns
  at that revision; tests hold it to the models and the models to the migrations.
- `open_view` is SQLite only; `EngineView` reads a ledger in another database (`ledger.url`)
  through an engine that `store.make_engine` opened (and so checked or migrated), in one
  transaction.
- An absent ledger reads as an empty one (nothing is created).
- The rows carry the columns the list views read, with the names and Python types the
  SQLModel models give them (aware datetimes, exact Decimals, bools), and the reads return
  them in the same order as `Ledger`'s and `Clusters`' reads of the same name, so the
  documents (`report.documents`, `report.clusters`) built from either are the same.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TypeVar

from orchestrator.errors import UnknownJob
from orchestrator.ledger.measures import UP, Billed, lease_cost
from orchestrator.ledger.migrations import HEAD

SCHEMA_REVISION = HEAD  # the revision whose tables and columns `LAYOUT` lists

# Every table and column of the SQLModel models (store.py) at SCHEMA_REVISION.
LAYOUT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("checkpoint", ("digest", "files_json", "id", "in_mirror", "job_id", "kind", "name",
                    "pruned_at", "pulled_at", "size_bytes", "step", "store_url", "stored_at")),
    ("controller_lease", ("cancel_at", "cancel_by", "expires_at", "holder", "job_id", "machine",
                          "renewed_at", "taken_at")),
    ("event", ("at", "id", "job_id", "kind", "message", "step")),
    ("gpu_sample", ("at", "gpu", "id", "job_id", "mem_total_mib", "mem_used_mib", "ok", "rank",
                    "util_pct")),
    ("host_lease", ("ended_at", "host", "instance_id", "launched_at", "price_per_hour",
                    "provider")),
    ("idle_lease", ("cluster_id", "ended_at", "id", "instance_id", "launched_at",
                    "price_per_hour", "rank")),
    ("job", ("cluster_id", "controller", "created_at", "ended_at", "exit_code", "gpus_per_node",
             "id", "identity", "loss", "name", "nodes", "owner", "policy_state", "provider",
             "reason", "recoveries", "spec_json", "spec_path", "started_at", "state", "step",
             "stop_state", "switches")),
    ("kept_cluster", ("autostop_s", "created_at", "ended_at", "gpus_per_node", "id",
                      "idle_since", "job_id", "machine", "name", "nodes", "provider", "reason",
                      "state")),
    ("lease", ("cluster", "ended_at", "id", "identity", "instance_id", "instance_type",
               "job_id", "launched_at", "market", "price_per_hour", "provider", "rank")),
    ("ledger_meta", ("key", "value")),
    ("progress_sample", ("at", "epoch", "id", "img_s", "job_id", "loss", "lr", "step")),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobRow:
    """A `store.Job` without its spec and controller bookkeeping."""

    id: str
    name: str
    state: str
    provider: str
    nodes: int
    gpus_per_node: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    step: int | None
    loss: float | None
    exit_code: int | None
    reason: str | None
    recoveries: int
    switches: int
    cluster_id: str | None


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A `store.Lease`."""

    id: int
    job_id: str
    cluster: str
    provider: str
    instance_id: str
    rank: int
    market: str
    instance_type: str
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class HostLeaseRow:
    """A `store.HostLease`: a launched controller host's billable life."""

    instance_id: str
    provider: str
    host: str
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class SpanRow:
    """What a bill reads of a `store.Lease`: whose it is, its price and its span."""

    job_id: str
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobBill:
    """A job's bill from its leases: how many, their node-seconds, what they cost (exact USD),
    and whether one of them still bills."""

    leases: int
    node_seconds: float
    spend: Decimal
    running: bool


NO_BILL = JobBill(0, 0.0, Decimal(0), False)


class JobSpan(Billed, Protocol):
    """A lease's span with its job: a `SpanRow`, `LeaseRow` or `store.Lease`."""

    @property
    def job_id(self) -> str: ...


def bills_of(spans: Iterable[JobSpan], now: datetime) -> dict[str, JobBill]:
    """Each job's bill from its leases' spans, at `now` (a lease still open bills until then),
    with `measures.lease_cost`'s arithmetic. Anything with a lease's job, price and span
    will do (`SpanRow`, `LeaseRow`, `store.Lease`)."""
    count: dict[str, int] = {}
    seconds: dict[str, float] = {}
    spend: dict[str, Decimal] = {}
    running: dict[str, bool] = {}
    for span in spans:
        job = span.job_id
        count[job] = count.get(job, 0) + 1
        seconds[job] = (
            seconds.get(job, 0.0) + ((span.ended_at or now) - span.launched_at).total_seconds()
        )
        spend[job] = spend.get(job, Decimal(0)) + lease_cost(span, now)
        running[job] = running.get(job, False) or span.ended_at is None
    return {job: JobBill(count[job], seconds[job], spend[job], running[job]) for job in count}


@dataclass(frozen=True, slots=True)
class IdleLeaseRow:
    """A `store.IdleLease`."""

    id: int
    cluster_id: str
    instance_id: str
    rank: int
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class ClusterRow:
    """A `store.KeptCluster`."""

    id: str
    name: str
    provider: str
    state: str
    nodes: int
    gpus_per_node: int
    autostop_s: float | None
    created_at: datetime
    ended_at: datetime | None
    job_id: str | None
    idle_since: datetime | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """A `store.CheckpointRecord`."""

    id: int
    job_id: str
    name: str
    step: int | None
    size_bytes: int
    pulled_at: datetime
    kind: str | None
    digest: str | None
    in_mirror: bool
    stored_at: datetime | None
    store_url: str | None
    files_json: str | None
    pruned_at: datetime | None


# Columns whose stored text or integer SQLModel turns into another type (store.UTCDateTime,
# store.DecimalText, bool); NULL stays None.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(
        (
            "created_at",
            "started_at",
            "ended_at",
            "launched_at",
            "idle_since",
            "pulled_at",
            "stored_at",
            "pruned_at",
        ),
        datetime.fromisoformat,
    ),  # fmt: skip
    "price_per_hour": Decimal,
    "in_mirror": bool,
}

_Row = TypeVar("_Row")


def _names(kind: type[_Row]) -> list[str]:
    """The columns a row dataclass reads, in its fields' order."""
    return [field.name for field in fields(kind)]  # type: ignore[arg-type]


def _as_rows(
    kind: type[_Row], converters: list[Callable[[Any], Any] | None], found: Iterable[Any]
) -> list[_Row]:
    """`found` (database rows in `kind`'s column order) as `kind`, each value through its
    converter (None: as read)."""
    return [
        kind(
            *(
                value if value is None or convert is None else convert(value)
                for value, convert in zip(row, converters, strict=True)
            )
        )
        for row in found
    ]


class LedgerView:
    """The ledger's reads that the list views make, with `Ledger`'s names and orders; its
    kept clusters' reads are `clusters` (those of `ledger.clusters.Clusters`)."""

    def __init__(self, connection: sqlite3.Connection | None) -> None:
        self._db = connection  # None: no ledger file, every read is empty
        self.clusters = ClustersView(self)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> LedgerView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, kind: type[_Row], table: str, clause: str = "", *args: object) -> list[_Row]:
        """Rows of `table` as `kind` (a row dataclass), `clause` after FROM (WHERE, ORDER BY)."""
        if self._db is None:
            return []
        names = _names(kind)
        query = f'SELECT {", ".join(names)} FROM "{table}" {clause}'
        return _as_rows(kind, [_CONVERT.get(name) for name in names], self._db.execute(query, args))

    def jobs(self, *, limit: int | None = None) -> list[JobRow]:
        """Newest first, like `Ledger.jobs`."""
        if limit:
            return self.rows(JobRow, "job", "ORDER BY created_at DESC LIMIT ?", limit)
        return self.rows(JobRow, "job", "ORDER BY created_at DESC")

    def job_states(self) -> list[tuple[str, str]]:
        """(id, state) of every job."""
        return [] if self._db is None else self._db.execute("SELECT id, state FROM job").fetchall()

    def get_job(self, job_id: str) -> JobRow:
        found = self.rows(JobRow, "job", "WHERE id = ?", job_id)
        if not found:
            raise UnknownJob(f"no job {job_id!r} in the ledger", hint="`orch status` lists jobs")
        return found[0]

    def leases(self, job_id: str | None = None) -> list[LeaseRow]:
        """A job's leases, oldest first; every job's with no `job_id` (`Ledger.leases`)."""
        if job_id is None:
            return self.rows(LeaseRow, "lease", "ORDER BY id")
        return self.rows(LeaseRow, "lease", "WHERE job_id = ? ORDER BY id", job_id)

    def host_leases(self) -> list[HostLeaseRow]:
        """Every launched controller host's lease, the oldest first (`HostLeases.all`)."""
        return self.rows(HostLeaseRow, "host_lease", "ORDER BY launched_at")

    def lease_spans(self) -> list[SpanRow]:
        """Every lease's job, price and span, oldest first: a bill of every job in one read
        of four columns."""
        return self.rows(SpanRow, "lease", "ORDER BY id")

    def job_heads(self) -> list[tuple[str, str, str]]:
        """(id, state, provider) of every job, newest first (the order of `jobs`)."""
        if self._db is None:
            return []
        return self._db.execute(
            "SELECT id, state, provider FROM job ORDER BY created_at DESC"
        ).fetchall()

    def job_bills(self, now: datetime) -> dict[str, JobBill]:
        """Every job's bill at `now` (`bills_of`), in one read; a job with no lease has none."""
        return bills_of(self.lease_spans(), now)

    def checkpoints(self, job_id: str, *, live_only: bool = False) -> list[CheckpointRow]:
        live = " AND pruned_at IS NULL" if live_only else ""
        return self.rows(CheckpointRow, "checkpoint", f"WHERE job_id = ?{live} ORDER BY id", job_id)


class ClustersView:
    """The kept clusters' reads of `ledger.clusters.Clusters`, with its names and orders."""

    def __init__(self, view: LedgerView) -> None:
        self._view = view

    def all(self, *, up_only: bool = False) -> list[ClusterRow]:
        where = "WHERE state = ? " if up_only else ""
        args = (UP,) if up_only else ()
        return self._view.rows(
            ClusterRow, "kept_cluster", f"{where}ORDER BY created_at DESC", *args
        )

    def jobs(self, cluster_id: str) -> list[JobRow]:
        """The cluster's jobs, oldest first."""
        return self._view.rows(
            JobRow, "job", "WHERE cluster_id = ? ORDER BY created_at", cluster_id
        )

    def idle_leases(self, cluster_id: str) -> list[IdleLeaseRow]:
        return self._view.rows(
            IdleLeaseRow, "idle_lease", "WHERE cluster_id = ? ORDER BY id", cluster_id
        )


class EngineView(LedgerView):
    """`LedgerView`'s reads of a ledger in any database, through SQLAlchemy on one connection
    and one transaction: the same SQL, run as the driver's own statement (no ORM object, no
    per-value type processing), and its values turned into the types the SQLModel models
    give (`store.UTCDateTime`, `store.DecimalText`): aware UTC datetimes, exact Decimals,
    bools. The engine is the caller's (opened with `store.make_engine`), never disposed here."""

    def __init__(self, engine: Any) -> None:
        super().__init__(None)
        self._connection: Any = engine.connect()
        self._connection.begin()
        self._qmark = engine.dialect.paramstyle == "qmark"

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _execute(self, query: str, args: tuple[object, ...]) -> Any:
        if not self._qmark:  # psycopg: format style
            query = query.replace("%", "%%").replace("?", "%s")
        return self._connection.exec_driver_sql(query, args)

    def rows(self, kind: type[_Row], table: str, clause: str = "", *args: object) -> list[_Row]:
        names = _names(kind)
        query = f'SELECT {", ".join(names)} FROM "{table}" {clause}'
        converters = [_ANY_CONVERT.get(name) for name in names]
        # fetched in one go, not row by row
        return _as_rows(kind, converters, self._execute(query, args).fetchall())

    def job_states(self) -> list[tuple[str, str]]:
        found = self._execute("SELECT id, state FROM job", ()).fetchall()
        return [(row[0], row[1]) for row in found]

    def job_heads(self) -> list[tuple[str, str, str]]:
        query = "SELECT id, state, provider FROM job ORDER BY created_at DESC"
        return [(row[0], row[1], row[2]) for row in self._execute(query, ()).fetchall()]

    def job_bills(self, now: datetime) -> dict[str, JobBill]:
        """On PostgreSQL the database sums the bills: its `numeric` arithmetic is exact (the
        price times each lease's span in microseconds, negative spans counted as none), so
        the figures are `bills_of`'s without reading every lease over the wire. Elsewhere,
        `bills_of` over every lease's span."""
        if self._qmark:
            return super().job_bills(now)
        span = "extract(epoch from (coalesce(ended_at, %s) - launched_at))::numeric"
        query = (
            f"SELECT job_id, count(*), sum({span}), "
            f"sum(price_per_hour * greatest({span}, 0)) / 3600, bool_or(ended_at IS NULL) "
            "FROM lease GROUP BY job_id"
        )
        found = self._connection.exec_driver_sql(query, (now, now)).fetchall()
        return {
            job: JobBill(count, float(seconds), spend, bool(running))
            for job, count, seconds, spend, running in found
        }


def _utc(value: str | datetime) -> datetime:
    """`store.UTCDateTime`'s reading: ISO text (SQLite) or a timestamptz (PostgreSQL)."""
    return value.astimezone(UTC) if isinstance(value, datetime) else datetime.fromisoformat(value)


# `_CONVERT` for values of any database: a driver may have made them datetimes or Decimals
_ANY_CONVERT: dict[str, Callable[[Any], Any]] = {
    name: _utc if convert == datetime.fromisoformat else convert
    for name, convert in _CONVERT.items()
}


def open_view(path: Path) -> LedgerView | None:
    """The view of the ledger file at `path` (an empty view when there is none); None when the
    view does not apply: the file is not a SQLite database that can be read, or its schema
    revision is not `SCHEMA_REVISION` (an older ledger, or one being created right now)."""
    if not path.exists():
        return LedgerView(None)
    try:
        connection = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30, isolation_level=None
        )
    except sqlite3.Error:
        return None
    try:
        connection.execute("BEGIN")  # every read of the view sees one snapshot
        stamp = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:  # not a database, no version table yet, unreadable
        connection.close()
        return None
    if stamp is None or stamp[0] != SCHEMA_REVISION:
        connection.close()
        return None
    return LedgerView(connection)
