"""The ledger's one read model for the read commands (`orch status`, `orch cost`, the
checks before every command): typed rows, never ORM objects, through the stdlib sqlite3 module
for the SQLite file (`open_view`) and through SQLAlchemy Core for a ledger in another database
(`open_url_view`, or `LedgerView.of_engine` over an engine the caller opened).

Through SQLModel the read commands' start-up would be mostly imports, and a list of jobs one
query per job. Here a list is a bounded number of statements whatever the number of jobs (the
jobs, then the leases and checkpoints of those listed, each in one read), and `orch cost` over
ten thousand jobs is two queries (on PostgreSQL the database sums the bills).

Contract:
- Read only: the file is opened with `mode=ro`, and all reads of one view see one snapshot
  (one read transaction). It never creates, checks or migrates anything.
- Only a ledger this orch would open as is: `open_view` and `open_url_view` return None (the
  caller then takes the full path, `store.make_engine`, which migrates or reports the
  problem) unless the ledger is stamped with this orch's newest schema revision
  (`alembic_version` holds `SCHEMA_REVISION`, `migrations.HEAD`). `LAYOUT` lists the models'
  tables and columns at that revision; tests hold it to the models and the models to the
  migrations.
- An absent ledger file reads as an empty one (nothing is created).
- The rows carry the columns the list views read, with the names and Python types the
  SQLModel models give them (aware datetimes, exact Decimals, bools), and the reads return
  them in the same order as `Ledger`'s and `Clusters`' reads of the same name, so the
  documents (`report.documents`, `report.clusters`) built from either are the same.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TypeVar

from orchestrator.errors import UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.measures import UP
from orchestrator.ledger.migrations import HEAD
from orchestrator.ledger.rows import (
    CheckpointRow,
    ClusterRow,
    ControllerLeaseRow,
    EventRow,
    GpuSampleRow,
    HostLeaseRow,
    IdleLeaseRow,
    JobBill,
    JobDetailRow,
    JobRow,
    LeaseRow,
    ProgressSampleRow,
    SpanRow,
    bills_of,
)

SCHEMA_REVISION = HEAD  # the revision whose tables and columns `LAYOUT` lists

# Every table and column of the SQLModel models (store.py) at SCHEMA_REVISION.
LAYOUT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("checkpoint", ("digest", "files_json", "id", "in_mirror", "job_id", "kind", "name",
                    "pruned_at", "pulled_at", "size_bytes", "step", "store_url", "stored_at")),
    ("controller_lease", ("cancel_at", "cancel_by", "expires_at", "holder", "job_id", "machine",
                          "renewed_at", "taken_at")),
    ("event", ("at", "id", "job_id", "kind", "message", "step")),
    ("fleet", ("created_at", "identity", "known_hosts", "name", "owner", "price_per_hour",
               "price_unit")),
    ("fleet_claim", ("claimed_at", "detail", "host_id", "id", "instance_id", "job_id", "owner",
                     "rank", "released_at", "slot")),
    ("fleet_host", ("address", "checked_at", "cpus", "disk_free_gb", "fleet", "gpus",
                    "health_note", "healthy", "host_key", "id", "memory_mib", "port", "position",
                    "proxy_jump", "python", "torch", "user")),
    ("fleet_waiter", ("fleet", "job_id", "nodes", "owner", "since", "slots_per_node")),
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


def _utc(value: str | datetime) -> datetime:
    """`store.UTCDateTime`'s reading: ISO text (SQLite) or a timestamptz (PostgreSQL)."""
    return value.astimezone(UTC) if isinstance(value, datetime) else datetime.fromisoformat(value)


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
            "expires_at",
            "at",
            "stored_at",
            "pruned_at",
        ),
        _utc,
    ),  # fmt: skip
    "price_per_hour": Decimal,
    "in_mirror": bool,
    "ok": bool,
}

_Row = TypeVar("_Row")


class _OfJob(Protocol):
    @property
    def job_id(self) -> str: ...


_Keyed = TypeVar("_Keyed", bound=_OfJob)


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


class _Source(Protocol):
    """Where a `LedgerView` reads: SQL with `?` parameters in, every row fetched out."""

    sums_bills: bool  # the database sums bills exactly (PostgreSQL `numeric`)

    def moment(self, at: datetime) -> object:
        """`at` as a parameter compared with a stored time (`store.UTCDateTime`)."""
        ...

    def fetch(self, query: str, args: Sequence[object]) -> list[Any]: ...
    def close(self) -> None: ...


class _SqliteSource:
    """The ledger file through the stdlib sqlite3 module, read-only, in one read transaction."""

    sums_bills = False

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def moment(self, at: datetime) -> object:
        return _iso(at)

    def fetch(self, query: str, args: Sequence[object]) -> list[Any]:
        return self.connection.execute(query, tuple(args)).fetchall()

    def close(self) -> None:
        self.connection.close()


class _EngineSource:
    """A ledger in any database through a SQLAlchemy engine: one connection, one transaction,
    the SQL run as the driver's own statement (no ORM object, no per-value type processing).
    The engine is disposed on close only when `owned`."""

    def __init__(self, engine: Any, *, owned: bool = False) -> None:
        self.connection: Any = engine.connect()
        self.connection.begin()
        self._engine = engine if owned else None
        self._qmark = engine.dialect.paramstyle == "qmark"
        self.sums_bills = engine.dialect.name == "postgresql"

    def moment(self, at: datetime) -> object:
        return at.astimezone(UTC) if self.sums_bills else _iso(at)

    def fetch(self, query: str, args: Sequence[object]) -> list[Any]:
        if not self._qmark:  # psycopg: format style
            query = query.replace("%", "%%").replace("?", "%s")
        return list(self.connection.exec_driver_sql(query, tuple(args)).fetchall())

    def close(self) -> None:
        self.connection.close()
        if self._engine is not None:
            self._engine.dispose()


_LIVE = tuple(sorted(state.value for state in JobState if not state.is_final))


class LedgerView:
    """The ledger's one read model for the read commands: typed rows (never ORM objects),
    with `Ledger`'s names and orders, over the SQLite file (`open_view`) or any database
    (`LedgerView.of_engine`, `open_url_view`); its kept clusters' reads are `clusters`
    (those of `ledger.clusters.Clusters`). Every read is one statement, whatever the number
    of jobs: the list reads take the ids they need (`leases_of`, `checkpoints_of`)."""

    def __init__(self, source: _Source | None) -> None:
        self._source = source  # None: no ledger file, every read is empty
        self.clusters = ClustersView(self)

    @classmethod
    def of_engine(cls, engine: Any) -> LedgerView:
        """A view through `engine` (opened with `store.make_engine`, so checked or
        migrated), which stays the caller's: closing the view does not dispose it."""
        return cls(_EngineSource(engine))

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def __enter__(self) -> LedgerView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, query: str, *args: object) -> list[Any]:
        """The rows of one statement (`?` parameters) as tuples; none without a ledger."""
        return [] if self._source is None else self._source.fetch(query, args)

    def rows(self, kind: type[_Row], table: str, clause: str = "", *args: object) -> list[_Row]:
        """Rows of `table` as `kind` (a row dataclass), `clause` after FROM (WHERE, ORDER BY)."""
        names = _names(kind)
        query = f'SELECT {", ".join(names)} FROM "{table}" {clause}'
        return _as_rows(kind, [_CONVERT.get(name) for name in names], self.fetch(query, *args))

    def jobs(self, *, limit: int | None = None, since: datetime | None = None) -> list[JobRow]:
        """Newest first, like `Ledger.jobs`; at most `limit`, those created at or after
        `since`."""
        where, args = self._since(since)
        if limit:
            return self.rows(JobRow, "job", f"{where}ORDER BY created_at DESC LIMIT ?",
                             *args, limit)  # fmt: skip
        return self.rows(JobRow, "job", f"{where}ORDER BY created_at DESC", *args)

    def live_jobs(self) -> list[JobRow]:
        """Every unfinished job, newest first."""
        marks = ", ".join("?" * len(_LIVE))
        return self.rows(JobRow, "job", f"WHERE state IN ({marks}) ORDER BY created_at DESC",
                         *_LIVE)  # fmt: skip

    def has_fleets(self) -> bool:
        """Whether the ledger holds a fleet (`orch fleet add`)."""
        return bool(self.fetch("SELECT name FROM fleet LIMIT 1"))

    def fleet_queues(self) -> dict[str, dict[str, Any]]:
        """Each job waiting in a fleet's queue: {"fleet", "position" (1 first), "of"}."""
        marks = ", ".join("?" * len(_LIVE))
        found = self.fetch(  # a job that ended waits no more, whatever its row says
            "SELECT w.job_id, w.fleet FROM fleet_waiter w JOIN job j ON j.id = w.job_id "
            f"WHERE j.state IN ({marks}) ORDER BY w.fleet, w.since, w.job_id",
            *_LIVE,
        )
        lines: dict[str, list[str]] = {}
        for job_id, fleet in found:
            lines.setdefault(str(fleet), []).append(str(job_id))
        return {
            job_id: {"fleet": fleet, "position": at + 1, "of": len(line)}
            for fleet, line in lines.items()
            for at, job_id in enumerate(line)
        }

    def job_count(self, *, since: datetime | None = None) -> int:
        """How many jobs the ledger holds (created at or after `since`)."""
        where, args = self._since(since)
        found = self.fetch(f"SELECT count(*) FROM job {where}", *args)
        return int(found[0][0]) if found else 0

    def job_states(self) -> list[tuple[str, str]]:
        """(id, state) of every job."""
        return [(row[0], row[1]) for row in self.fetch("SELECT id, state FROM job")]

    def get_job(self, job_id: str) -> JobRow:
        found = self.rows(JobRow, "job", "WHERE id = ?", job_id)
        if not found:
            raise UnknownJob(f"no job {job_id!r} in the ledger", hint="`orch status` lists jobs")
        return found[0]

    def job_detail(self, job_id: str) -> JobDetailRow:
        """`get_job` with the job's spec (one job's view)."""
        found = self.rows(JobDetailRow, "job", "WHERE id = ?", job_id)
        if not found:
            raise UnknownJob(f"no job {job_id!r} in the ledger", hint="`orch status` lists jobs")
        return found[0]

    def events(self, job_id: str) -> list[EventRow]:
        """A job's events, oldest first (`Ledger.events`)."""
        return self.rows(EventRow, "event", "WHERE job_id = ? ORDER BY id", job_id)

    def latest_gpu_samples(self, job_id: str) -> list[GpuSampleRow]:
        """The newest sample of each (node, GPU) of a job, among its newest 512
        (`Ledger.latest_gpu_samples`)."""
        found = self.rows(
            GpuSampleRow, "gpu_sample", "WHERE job_id = ? ORDER BY id DESC LIMIT 512", job_id
        )
        newest: dict[tuple[int, int], GpuSampleRow] = {}
        for sample in found:
            newest.setdefault((sample.rank, sample.gpu), sample)
        return [newest[key] for key in sorted(newest)]

    def gpu_samples(self, job_id: str) -> list[GpuSampleRow]:
        """Every GPU sample of a job, oldest first (`Ledger.gpu_samples`)."""
        return self.rows(GpuSampleRow, "gpu_sample", "WHERE job_id = ? ORDER BY id", job_id)

    def progress_samples(self, job_id: str) -> list[ProgressSampleRow]:
        """Rank 0's progress history of a job, oldest first (`Ledger.progress_samples`)."""
        return self.rows(
            ProgressSampleRow, "progress_sample", "WHERE job_id = ? ORDER BY id", job_id
        )

    def find_jobs(
        self,
        *,
        states: Sequence[str] = (),
        owner: str | None = None,
        name_part: str | None = None,
        limit: int,
    ) -> tuple[list[JobRow], int]:
        """The newest `limit` jobs in one of `states` (any when empty), of `owner`, whose
        name holds `name_part` (case-insensitive, taken literally), and how many match in all."""
        clauses: list[str] = []
        args: list[object] = []
        if states:
            clauses.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(states)
        if owner is not None:
            clauses.append("owner = ?")
            args.append(owner)
        if name_part:
            literal = "".join("\\" + c if c in "\\%_" else c for c in name_part.lower())
            clauses.append("lower(name) LIKE ? ESCAPE '\\'")
            args.append(f"%{literal}%")
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        found = self.rows(JobRow, "job", f"{where}ORDER BY created_at DESC LIMIT ?", *args, limit)
        counted = self.fetch(f"SELECT count(*) FROM job {where}", *args)
        return found, int(counted[0][0]) if counted else 0

    def owners(self) -> list[str]:
        """Every owner label the ledger's jobs carry, sorted."""
        found = self.fetch("SELECT DISTINCT owner FROM job WHERE owner IS NOT NULL")
        return sorted(str(row[0]) for row in found)

    def specs_of(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The recorded spec (JSON text) of each of `job_ids`, in one read."""
        if not job_ids:
            return {}
        marks = ", ".join("?" * len(job_ids))
        found = self.fetch(f"SELECT id, spec_json FROM job WHERE id IN ({marks})", *job_ids)
        return {str(row[0]): str(row[1] or "{}") for row in found}

    def leases(self, job_id: str | None = None) -> list[LeaseRow]:
        """A job's leases, oldest first; every job's with no `job_id` (`Ledger.leases`)."""
        if job_id is None:
            return self.rows(LeaseRow, "lease", "ORDER BY id")
        return self.rows(LeaseRow, "lease", "WHERE job_id = ? ORDER BY id", job_id)

    def leases_of(self, job_ids: Sequence[str]) -> dict[str, list[LeaseRow]]:
        """The leases of each of `job_ids`, oldest first, in one read; a job with none is
        absent."""
        return _by_job(self._of(LeaseRow, "lease", job_ids, ""))

    def checkpoints(self, job_id: str, *, live_only: bool = False) -> list[CheckpointRow]:
        live = " AND pruned_at IS NULL" if live_only else ""
        return self.rows(CheckpointRow, "checkpoint", f"WHERE job_id = ?{live} ORDER BY id", job_id)

    def checkpoints_of(
        self, job_ids: Sequence[str], *, live_only: bool = False
    ) -> dict[str, list[CheckpointRow]]:
        """`checkpoints` of each of `job_ids` in one read; a job with none is absent."""
        live = " AND pruned_at IS NULL" if live_only else ""
        return _by_job(self._of(CheckpointRow, "checkpoint", job_ids, live))

    def _of(self, kind: type[_Row], table: str, job_ids: Sequence[str], more: str) -> list[_Row]:
        if not job_ids:
            return []
        marks = ", ".join("?" * len(job_ids))
        return self.rows(kind, table, f"WHERE job_id IN ({marks}){more} ORDER BY id", *job_ids)

    def host_leases(self) -> list[HostLeaseRow]:
        """Every launched controller host's lease, the oldest first (`HostLeases.all`)."""
        return self.rows(HostLeaseRow, "host_lease", "ORDER BY launched_at")

    def lease_spans(self) -> list[SpanRow]:
        """Every lease's job, price and span, oldest first: a bill of every job in one read
        of four columns."""
        return self.rows(SpanRow, "lease", "ORDER BY id")

    def month_spans(
        self, since: datetime
    ) -> list[tuple[str | None, Decimal, datetime, datetime | None]]:
        """(owner, price per hour, launched, ended) of every job lease and kept cluster idle
        lease still billing at `since` (open, or ended after it): the job leases, then the
        idle leases, each in the order recorded, in two reads whatever the ledger's size.
        These are what the monthly budgets count (`ledger.month`): a lease is billed to its
        job's owner, an idle lease to the owner of its cluster's latest job (None: none)."""
        moment = None if self._source is None else self._source.moment(since)
        leases = self.fetch(
            "SELECT j.owner, l.price_per_hour, l.launched_at, l.ended_at FROM lease l "
            "LEFT JOIN job j ON j.id = l.job_id "
            "WHERE l.ended_at IS NULL OR l.ended_at > ? ORDER BY l.id",
            moment,
        )
        idle = self.fetch(
            "SELECT (SELECT j.owner FROM job j WHERE j.cluster_id = i.cluster_id "
            "ORDER BY j.created_at DESC LIMIT 1), i.price_per_hour, i.launched_at, i.ended_at "
            "FROM idle_lease i WHERE i.ended_at IS NULL OR i.ended_at > ? ORDER BY i.id",
            moment,
        )
        return [
            (owner, Decimal(price), _utc(launched), None if ended is None else _utc(ended))
            for owner, price, launched, ended in [*leases, *idle]
        ]

    def job_heads(
        self, *, limit: int | None = None, since: datetime | None = None
    ) -> list[tuple[str, str, str]]:
        """(id, state, provider) of every job, newest first (the order and selection of
        `jobs`)."""
        where, args = self._since(since)
        query = f"SELECT id, state, provider FROM job {where}ORDER BY created_at DESC"
        if limit:
            query, args = f"{query} LIMIT ?", [*args, limit]
        return [(row[0], row[1], row[2]) for row in self.fetch(query, *args)]

    def controller_leases(self) -> dict[str, ControllerLeaseRow]:
        """Every job's controller lease, by job id (`ControllerLeases.all`)."""
        found = self.rows(ControllerLeaseRow, "controller_lease")
        return {lease.job_id: lease for lease in found}

    def clock(self) -> datetime:
        """The ledger's clock (`ledger.clock.database_now`): the time leases are judged by."""
        if self._source is not None and self._source.sums_bills:  # PostgreSQL
            return _utc(self.fetch("SELECT clock_timestamp()")[0][0])
        found = self.fetch("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(found[0][0]).replace(tzinfo=UTC)

    def _since(self, since: datetime | None) -> tuple[str, list[object]]:
        """The WHERE clause (and its argument) of the jobs created at or after `since`."""
        if since is None or self._source is None:
            return "", []
        return "WHERE created_at >= ? ", [self._source.moment(since)]

    def job_bills(self, now: datetime) -> dict[str, JobBill]:
        """Every job's bill at `now` (`bills_of`), in one read; a job with no lease has none.

        On PostgreSQL the database sums the bills: its `numeric` arithmetic is exact (the
        price times each lease's span in microseconds, negative spans counted as none), so
        the figures are `bills_of`'s without reading every lease over the wire."""
        if self._source is None or not self._source.sums_bills:
            return bills_of(self.lease_spans(), now)
        span = "extract(epoch from (coalesce(ended_at, ?) - launched_at))::numeric"
        query = (
            f"SELECT job_id, count(*), sum({span}), "
            f"sum(price_per_hour * greatest({span}, 0)) / 3600, bool_or(ended_at IS NULL) "
            "FROM lease GROUP BY job_id"
        )
        return {
            job: JobBill(count, float(seconds), spend, bool(running))
            for job, count, seconds, spend, running in self.fetch(query, now, now)
        }


def _iso(at: datetime) -> str:
    """`at` as store.UTCDateTime keeps it in SQLite: UTC ISO text, whose order is the
    times' order."""
    return at.astimezone(UTC).isoformat()


def _by_job(found: Iterable[_Keyed]) -> dict[str, list[_Keyed]]:
    grouped: dict[str, list[_Keyed]] = {}
    for row in found:
        grouped.setdefault(row.job_id, []).append(row)
    return grouped


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
    return LedgerView(_SqliteSource(connection))


def open_url_view(raw: str) -> LedgerView | None:
    """The view of the ledger at the database URL `raw` (`ledger.url`), through SQLAlchemy
    Core alone (no SQLModel, nothing created or migrated); None when it does not apply and
    the caller must take the full path (`store.make_engine`), which migrates or reports the
    problem: the URL is not one the ledger uses, the database does not answer, or its schema
    revision is not `SCHEMA_REVISION`."""
    from orchestrator.errors import OrchError
    from orchestrator.ledger.database import database_url, postgresql_engine

    try:
        url = database_url(raw)
    except OrchError:
        return None
    if url.get_backend_name() == "sqlite":
        return open_view(Path(url.database)) if url.database not in (None, "", ":memory:") else None
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    engine = postgresql_engine(url, poolclass=NullPool)
    try:
        source = _EngineSource(engine, owned=True)
    except SQLAlchemyError:
        engine.dispose()
        return None
    try:
        stamp = source.fetch("SELECT version_num FROM alembic_version", ())
    except SQLAlchemyError:  # no version table yet
        stamp = []
    if not stamp or stamp[0][0] != SCHEMA_REVISION:
        source.close()
        return None
    return LedgerView(source)
