"""The ledger: jobs, instance leases, events and pulled checkpoints (SQLModel), in the SQLite
file under ORCH_HOME or in PostgreSQL (`ledger.url`); the same models and code serve both.

The ledger is the single source of truth about what orch started and what it cost. Callers
write intent before acting (a job is PROVISIONING before `launch` is called), so a controller
killed at any line leaves enough behind to reconcile. The engine is always passed in.

Money: prices are recorded per lease at launch time (USD per hour, exact decimals) and never
re-read from a catalog; spend = sum over leases of seconds x price / 3600.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import BigInteger, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlmodel import Column, Field, Session, SQLModel, create_engine, select

import orchestrator.ledger.fleets  # noqa: F401 - the fleets' tables are the ledger's too
from orchestrator.errors import UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.database import database_url, postgresql_engine
from orchestrator.ledger.fencing import Fence, LeaseLost, claim, lost_reason
from orchestrator.ledger.measures import hourly_rate as hourly_rate
from orchestrator.ledger.measures import lease_cost as lease_cost
from orchestrator.ledger.measures import total_cost as total_cost
from orchestrator.ledger.measures import utcnow
from orchestrator.ledger.migrate import create_sqlite, upgrade
from orchestrator.ledger.types import DecimalText as DecimalText
from orchestrator.ledger.types import UTCDateTime as UTCDateTime

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.providers.base import Instance


def _utc_column(nullable: bool = True, *, index: bool = False) -> Column:
    return Column(UTCDateTime(), nullable=nullable, index=index)


class Job(SQLModel, table=True):
    id: str = Field(primary_key=True)  # e.g. "demo-ddp-3f9c1a"
    name: str
    state: str = Field(default=JobState.PENDING, index=True)
    provider: str
    nodes: int
    gpus_per_node: int
    spec_json: str  # the validated JobSpec as JSON, flags applied
    spec_path: str  # the YAML file it was loaded from
    created_at: datetime = Field(sa_column=_utc_column(nullable=False, index=True))
    started_at: datetime | None = Field(default=None, sa_column=_utc_column())
    ended_at: datetime | None = Field(default=None, sa_column=_utc_column())
    step: int | None = None  # last step reported by rank 0
    loss: float | None = None  # last loss reported by rank 0
    exit_code: int | None = None  # orch's exit code for the job once final
    reason: str | None = None  # why it ended (failure message, cancel, ...)
    recoveries: int = 0
    switches: int = 0  # planned moves of the spot policy (market changes, waits); not recoveries
    policy_state: str | None = None  # the spot policy's driver state, JSON (deadline_driver)
    controller: str | None = None  # "host:pid" of the process driving the job
    # While STOPPING: the final state the stop leads to, so an adopting controller can finish it.
    stop_state: str | None = None
    # The cloud identity (CloudIdentity JSON) the job's nodes were launched as; a controller
    # acting as another refuses the job. None: not launched yet, or a job of a ledger made
    # before the column (migrated: `ledger.migrate` adds it empty).
    identity: str | None = None
    # The kept cluster the job runs on (`KeptCluster.id`), whose id then names the nodes (their
    # tags, SSH key and directories) in place of the job's; None: nodes of its own.
    cluster_id: str | None = Field(default=None, index=True)
    # The owner label of whoever submitted it (config `owner`, else the login name): the key of
    # the per-user monthly budget. None: submitted before team mode (migration 0002 adds it empty).
    owner: str | None = Field(default=None, index=True)

    @property
    def node_owner(self) -> str:
        """The id the job's nodes are tagged, keyed and laid out by."""
        return self.cluster_id or self.id


class KeptCluster(SQLModel, table=True):
    """Nodes kept between jobs (`orch submit --cluster NAME`): up from the first job's launch
    until `orch down NAME`, a lost node, or its guards' autostop ends them."""

    __tablename__ = "kept_cluster"

    id: str = Field(primary_key=True)  # e.g. "dev-3f9c1a": the nodes' owner id
    name: str = Field(index=True)  # what the user calls it; one UP cluster per name and machine
    provider: str
    state: str = "UP"  # UP | DOWN
    nodes: int
    gpus_per_node: int
    autostop_s: float | None = None  # None: never
    created_at: datetime = Field(sa_column=_utc_column(nullable=False))
    ended_at: datetime | None = Field(default=None, sa_column=_utc_column())
    job_id: str | None = None  # the job that holds it now; None while idle
    idle_since: datetime | None = Field(default=None, sa_column=_utc_column())
    reason: str | None = None  # why it went DOWN
    # The machine id of the ORCH_HOME that made it (`control.process.machine_id`), its owner: on a
    # shared ledger only that machine ends it or runs jobs on it by name. None: made on a
    # ledger of one ORCH_HOME's own, or before clusters recorded it (on a shared ledger then
    # no machine's: `orch down NAME --force` ends it).
    machine: str | None = Field(default=None, index=True)


class IdleLease(SQLModel, table=True):
    """One kept node's billable time between jobs: billed to its cluster, not to a job."""

    __tablename__ = "idle_lease"

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(index=True, foreign_key="kept_cluster.id")
    instance_id: str = Field(index=True)
    rank: int
    price_per_hour: Decimal = Field(sa_column=Column(DecimalText(), nullable=False))
    launched_at: datetime = Field(sa_column=_utc_column(nullable=False))  # idle from
    ended_at: datetime | None = Field(default=None, sa_column=_utc_column())


class Lease(SQLModel, table=True):
    """One node's billable life: from launch until the provider acknowledged its end."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, foreign_key="job.id")
    cluster: str
    provider: str
    instance_id: str = Field(index=True)
    rank: int
    market: str  # "spot" or "on-demand"
    instance_type: str
    price_per_hour: Decimal = Field(sa_column=Column(DecimalText(), nullable=False))
    launched_at: datetime = Field(sa_column=_utc_column(nullable=False))
    ended_at: datetime | None = Field(default=None, sa_column=_utc_column())
    identity: str | None = None  # cloud identity (CloudIdentity JSON) the node was launched as

    @classmethod
    def from_instance(
        cls, instance: Instance, *, job_id: str, provider: str, identity: str | None
    ) -> Lease:
        """The lease of a node as the provider described it: billed from its launch time at the
        price it was launched at (never re-read from a catalog)."""
        return cls(
            job_id=job_id,
            cluster=instance.cluster,
            provider=provider,
            instance_id=instance.instance_id,
            rank=instance.rank,
            market=instance.market,
            instance_type=instance.instance_type,
            price_per_hour=instance.price_per_hour,
            launched_at=instance.launched_at,
            identity=identity,
        )


class ControllerLease(SQLModel, table=True):
    """On a ledger several machines share: the one controller allowed to drive a job, until
    `expires_at`. The holder renews it on every heartbeat; a holder that finds it taken by
    another, or expired and taken over, stops driving."""

    __tablename__ = "controller_lease"

    job_id: str = Field(primary_key=True, foreign_key="job.id")
    holder: str  # "machine:pid" of the controller process
    machine: str  # the holder's machine id (ORCH_HOME's), to tell its own leases from others'
    renewed_at: datetime = Field(sa_column=_utc_column(nullable=False))
    expires_at: datetime = Field(sa_column=_utc_column(nullable=False))
    # When this holder took it (None: taken before this was recorded); times are the ledger's
    # clock (`ledger.clock`)
    taken_at: datetime | None = Field(default=None, sa_column=_utc_column())
    # A cancel asked through the ledger by another machine: who asked ("machine:pid") and
    # when. The holder sees it when it renews and cancels the job (`control.process.lease_keeper`).
    cancel_by: str | None = None
    cancel_at: datetime | None = Field(default=None, sa_column=_utc_column())


class HostLease(SQLModel, table=True):
    """A launched controller host's billable life (`orch controller up --provider ...`): its
    own line of the bill, billed to no job, from its launch until its provider acknowledged
    its end (terminated, or powered off by its autostop). See `ledger.host_leases`."""

    __tablename__ = "host_lease"

    instance_id: str = Field(primary_key=True)
    provider: str
    host: str  # "user@addr:port" orch reached it at
    price_per_hour: Decimal = Field(sa_column=Column(DecimalText(), nullable=False))
    launched_at: datetime = Field(sa_column=_utc_column(nullable=False))
    ended_at: datetime | None = Field(default=None, sa_column=_utc_column())


class LedgerMeta(SQLModel, table=True):
    """Facts about the ledger itself, one row per key (e.g. its id)."""

    __tablename__ = "ledger_meta"

    key: str = Field(primary_key=True)
    value: str


LEDGER_ID_KEY = "ledger_id"
_LEASES = ControllerLease.__table__  # type: ignore[attr-defined]


class Event(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, foreign_key="job.id")
    at: datetime = Field(sa_column=_utc_column(nullable=False))
    kind: str  # PROVISIONING, LAUNCHED, SYNCED, STARTED, CHECKPOINT, SUCCEEDED, FAILED, ...
    message: str = ""
    step: int | None = None


class GpuSampleRecord(SQLModel, table=True):
    """One (downsampled) GPU reading of a node; `ok` False means the reading was unknown."""

    __tablename__ = "gpu_sample"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, foreign_key="job.id")
    rank: int  # node rank
    gpu: int  # GPU index on the node; -1 for the CPU fallback (job processes' CPU %)
    at: datetime = Field(sa_column=_utc_column(nullable=False))
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    ok: bool = True


class ProgressSampleRecord(SQLModel, table=True):
    """Rank 0's progress as the controller last read it at one watch check: a row is written
    only at a check whose step differs from the previous row's (the history the report draws;
    the job row keeps the latest step and loss)."""

    __tablename__ = "progress_sample"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, foreign_key="job.id")
    at: datetime = Field(sa_column=_utc_column(nullable=False))  # when the check read it
    step: int
    epoch: float | None = None
    loss: float | None = None
    lr: float | None = None
    img_s: float | None = None  # throughput as rank 0 reports it (samples per second)


class CheckpointRecord(SQLModel, table=True):
    """One version of one complete checkpoint, from when orch knew it whole until it was
    dropped from both the mirror and the store (`pruned_at`)."""

    __tablename__ = "checkpoint"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, foreign_key="job.id")
    name: str  # path relative to the job's checkpoint directory, e.g. "step-000120"
    step: int | None = None
    size_bytes: int = Field(sa_column=Column(BigInteger(), nullable=False))
    pulled_at: datetime = Field(sa_column=_utc_column(nullable=False))  # when known complete
    kind: str | None = None  # step | dcp | file (None: a migrated ledger's row from before it)
    digest: str | None = None  # digest of its files' paths and contents (Unit.version)
    in_mirror: bool = True  # its bytes are in the mirror on this machine
    stored_at: datetime | None = Field(default=None, sa_column=_utc_column())  # whole in the store
    store_url: str | None = None  # the store it is in (checkpoint.store)
    files_json: str | None = None  # [{path, digest, size, key}] of its files, JSON
    pruned_at: datetime | None = Field(default=None, sa_column=_utc_column())


def make_engine(location: Path | str) -> Engine:
    """Open (and create) the ledger at `location`, migrated to this orch's schema.

    `location` is a SQLite file's path, ":memory:" (a private in-memory ledger), or a database
    URL (`orchestrator.ledger.database`: PostgreSQL through psycopg 3, or sqlite:///PATH).
    Opening a ledger already at this orch's schema costs one query; any other is upgraded first
    under a lock (`orchestrator.ledger.migrate`). Raises LedgerUrlError for a URL the ledger
    cannot use, LedgerUnreachable when the database does not answer, LedgerTooNew when a newer
    orch migrated it.

    SQLite runs in WAL mode with a busy timeout so readers in other terminals never block the
    controller and never see a lock error.
    """
    lock_file: Path | None = None
    if isinstance(location, str) and "://" in location:
        url = database_url(location)
    elif str(location) == ":memory:":
        url = make_url("sqlite://")
    else:
        url = make_url("sqlite://").set(database=str(location))
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            path = Path(url.database)
            path.parent.mkdir(parents=True, exist_ok=True)
            lock_file = Path(f"{path}.schema-lock")
            if not path.exists():
                create_sqlite(path, lock_file=lock_file)
        engine = _sqlite_engine(url)
    else:
        engine = postgresql_engine(url)
    try:
        upgrade(engine, lock_file=lock_file)
    except BaseException:
        engine.dispose()
        raise
    return engine


def ledger_engine(settings: Settings) -> Engine:
    """The engine of the ledger `settings` name, migrated to this orch's schema: the database
    of `settings.ledger.url` (config.yaml `ledger.url`, or ORCH_DATABASE_URL) when set, else
    the SQLite file `settings.db_path` under ORCH_HOME. Every command opens its ledger here."""
    return make_engine(settings.ledger.url or settings.db_path)


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: object, _record: object) -> None:
        cursor = dbapi_conn.cursor()  # type: ignore[attr-defined]
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


_Row = TypeVar("_Row", bound=SQLModel)


class Ledger:
    """Reads and writes of the ledger; one short transaction per call.

    A ledger with a `fence` (`fenced`: a controller's, on a shared ledger) makes each write
    conditional on that controller lease, checked in the write's transaction
    (`ledger.fencing`); a write it refuses raises `LeaseLost` and writes nothing. Without
    one (a ledger of one ORCH_HOME's own, whose controller lock keeps out every other
    controller; a command that drives no job) writes are unconditional.
    """

    def __init__(self, engine: Engine, fence: Fence | None = None) -> None:
        self.engine = engine
        self.fence = fence
        self._ledger_id: str | None = None

    # --- fencing (ledger.fencing) -------------------------------------------------------
    def fenced(self, fence: Fence) -> Ledger:
        """This ledger, its writes conditional on `fence` (the caller's controller lease)."""
        fenced = Ledger(self.engine, fence)
        fenced._ledger_id = self._ledger_id
        return fenced

    def hold_fence(self, doing: str) -> None:
        """Before an action outside the ledger (`doing`, e.g. "end 2 node(s)"): check the
        fence and renew its lease for its length, in one transaction; `LeaseLost` (after the
        fence's `on_lost`) when the lease is another's. No-op without a fence."""
        fence = self.fence
        if fence is None:
            return
        with self.engine.begin() as connection:
            if claim(connection, _LEASES, fence, renew=True):
                return
        self._lose(fence, doing)

    def _fence_write(self, session: Session, doing: str) -> None:
        """The first statement of a write's transaction on a fenced ledger."""
        fence = self.fence
        if fence is None or claim(session.connection(), _LEASES, fence, renew=False):
            return
        session.rollback()
        self._lose(fence, doing)

    def _lose(self, fence: Fence, doing: str) -> None:
        with Session(self.engine) as session:
            lease = session.get(ControllerLease, fence.job_id)
        holder, machine = (lease.holder, lease.machine) if lease is not None else (None, None)
        why = lost_reason(fence, holder, machine, doing)
        if fence.on_lost is not None:
            fence.on_lost(why)
        raise LeaseLost(
            f"job {fence.job_id}: controller {fence.holder} stopped: {why}",
            hint="`orch status` shows which controller drives the job now; nothing was written",
        )

    # --- the ledger itself --------------------------------------------------------------
    @property
    def ledger_id(self) -> str:
        """This ledger's random id, made on first use and kept for the ledger's life.

        Every node orch launches is tagged with it, and only nodes that carry it are this
        ledger's to end. Two processes asking at once get the same id (insert if absent).
        """
        if self._ledger_id is None:
            with self.engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO ledger_meta (key, value) VALUES (:key, :value) "
                        "ON CONFLICT (key) DO NOTHING"
                    ),
                    {"key": LEDGER_ID_KEY, "value": secrets.token_hex(8)},
                )
                self._ledger_id = connection.execute(
                    text("SELECT value FROM ledger_meta WHERE key = :key"), {"key": LEDGER_ID_KEY}
                ).scalar_one()
        return self._ledger_id

    def forget_cached_id(self) -> None:
        """Read the ledger's id again on next use (it was taken over: `ledger.rebuilt`)."""
        self._ledger_id = None

    # --- jobs ---------------------------------------------------------------------------
    def add_job(self, job: Job) -> Job:
        with Session(self.engine, expire_on_commit=False) as session:
            session.add(job)
            session.commit()
            return job

    def get_job(self, job_id: str) -> Job:
        with Session(self.engine) as session:
            job = session.get(Job, job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id!r} in the ledger", hint="`orch status` lists jobs")
        return job

    def jobs(self, *, limit: int | None = None) -> list[Job]:
        with Session(self.engine) as session:
            query = select(Job).order_by(Job.created_at.desc())  # type: ignore[attr-defined]
            if limit:
                query = query.limit(limit)
            return list(session.exec(query))

    def jobs_of(self, job_ids: Iterable[str]) -> list[Job]:
        """The jobs of `job_ids`, in their order, in one read; raises UnknownJob for an id
        that is not in the ledger (as `get_job`)."""
        wanted = list(job_ids)
        if not wanted:
            return []
        with Session(self.engine) as session:
            query = select(Job).where(Job.id.in_(wanted))  # type: ignore[attr-defined]
            found = {job.id: job for job in session.exec(query)}
        return [found[job_id] if job_id in found else self.get_job(job_id) for job_id in wanted]

    def update_job(self, job_id: str, **fields: object) -> Job:
        return self._update(Job, job_id, f"no job {job_id!r} in the ledger", fields)

    def _update(self, model: type[_Row], key: object, missing: str, fields: dict) -> _Row:
        """Set `fields` on the row of `model` with primary key `key`, in one transaction."""
        with Session(self.engine, expire_on_commit=False) as session:
            self._fence_write(session, f"change {key} ({', '.join(fields)})")
            row = session.get(model, key)
            if row is None:
                raise UnknownJob(missing)
            for name, value in fields.items():
                setattr(row, name, value)
            session.add(row)
            session.commit()
            return row

    # --- leases -------------------------------------------------------------------------
    def open_lease(self, lease: Lease) -> Lease:
        with Session(self.engine, expire_on_commit=False) as session:
            self._fence_write(session, f"open the lease of {lease.instance_id}")
            session.add(lease)
            session.commit()
            return lease

    def close_leases(self, instance_ids: Iterable[str], ended_at: datetime) -> int:
        """Set the end time of the open leases of these instances, a job's and a kept
        cluster's idle ones alike; returns how many closed."""
        ids = list(instance_ids)
        closed = 0
        with Session(self.engine) as session:
            self._fence_write(session, f"close the leases of {', '.join(sorted(ids))}")
            for model in (Lease, IdleLease):
                query = select(model).where(
                    model.instance_id.in_(ids),  # type: ignore[attr-defined]
                    model.ended_at.is_(None),  # type: ignore[attr-defined]
                )
                for lease in session.exec(query):
                    lease.ended_at = ended_at
                    session.add(lease)
                    closed += 1
            session.commit()
        return closed

    def leases(self, job_id: str | None = None, *, open_only: bool = False) -> list[Lease]:
        with Session(self.engine) as session:
            query = select(Lease).order_by(Lease.id)  # type: ignore[arg-type]
            if job_id is not None:
                query = query.where(Lease.job_id == job_id)
            if open_only:
                query = query.where(Lease.ended_at.is_(None))  # type: ignore[union-attr]
            return list(session.exec(query))

    def spend(self, job_id: str | None = None, now: datetime | None = None) -> Decimal:
        return total_cost(self.leases(job_id), now or utcnow())

    # --- events and checkpoints ---------------------------------------------------------
    def add_event(
        self, job_id: str, kind: str, message: str = "", *, step: int | None = None
    ) -> Event:
        record = Event(job_id=job_id, at=utcnow(), kind=kind, message=message, step=step)
        with Session(self.engine, expire_on_commit=False) as session:
            self._fence_write(session, f"write a {kind} event")
            session.add(record)
            session.commit()
            return record

    def events(self, job_id: str) -> list[Event]:
        with Session(self.engine) as session:
            query = select(Event).where(Event.job_id == job_id).order_by(Event.id)  # type: ignore[arg-type]
            return list(session.exec(query))

    def add_checkpoint(self, record: CheckpointRecord) -> CheckpointRecord:
        with Session(self.engine, expire_on_commit=False) as session:
            self._fence_write(session, f"record checkpoint {record.name}")
            session.add(record)
            session.commit()
            return record

    def _add_rows(self, rows: Iterable[SQLModel]) -> None:
        with Session(self.engine) as session:
            self._fence_write(session, "record samples")
            session.add_all(list(rows))
            session.commit()

    def _job_rows(self, model: type[_Row], job_id: str) -> list[_Row]:
        """Every row of `model` (a table with `job_id` and `id`) of a job, oldest first."""
        with Session(self.engine) as session:
            query = (
                select(model)
                .where(model.job_id == job_id)  # type: ignore[attr-defined]
                .order_by(model.id)  # type: ignore[attr-defined]
            )
            return list(session.exec(query))

    def add_gpu_samples(self, records: Iterable[GpuSampleRecord]) -> None:
        self._add_rows(records)

    def latest_gpu_samples(self, job_id: str) -> list[GpuSampleRecord]:
        """The newest sample of each (node, GPU) of a job."""
        with Session(self.engine) as session:
            query = (
                select(GpuSampleRecord)
                .where(GpuSampleRecord.job_id == job_id)
                .order_by(GpuSampleRecord.id.desc())  # type: ignore[union-attr]
                .limit(512)
            )
            newest: dict[tuple[int, int], GpuSampleRecord] = {}
            for record in session.exec(query):
                newest.setdefault((record.rank, record.gpu), record)
        return [newest[key] for key in sorted(newest)]

    def gpu_samples(self, job_id: str) -> list[GpuSampleRecord]:
        """Every recorded sample of a job, oldest first (the history pictures are drawn from)."""
        return self._job_rows(GpuSampleRecord, job_id)

    def add_progress_sample(self, record: ProgressSampleRecord) -> None:
        self._add_rows([record])

    def progress_samples(self, job_id: str) -> list[ProgressSampleRecord]:
        """Every recorded progress sample of a job, oldest first."""
        return self._job_rows(ProgressSampleRecord, job_id)

    def checkpoints(self, job_id: str, *, live_only: bool = False) -> list[CheckpointRecord]:
        """A job's checkpoint records, oldest first; with `live_only`, those still kept in
        the mirror or the store."""
        with Session(self.engine) as session:
            query = (
                select(CheckpointRecord)
                .where(CheckpointRecord.job_id == job_id)
                .order_by(CheckpointRecord.id)  # type: ignore[arg-type]
            )
            if live_only:
                query = query.where(CheckpointRecord.pruned_at.is_(None))  # type: ignore[union-attr]
            return list(session.exec(query))

    def update_checkpoint(self, record_id: int, **fields: object) -> CheckpointRecord:
        missing = f"no checkpoint record {record_id} in the ledger"
        return self._update(CheckpointRecord, record_id, missing, fields)
