"""Fleets in the ledger: machines the user already has (`Fleet`, its `FleetHost`s), which job
holds which of their slots (`FleetClaim`), and the jobs waiting for slots (`FleetWaiter`).

A slot is a GPU index of a host, or on a host without GPUs a process slot 0..cpus-1. A claim
is one slot held by one node (an allocation, `instance_id`) of one job, from `claimed_at`
until `released_at`. A UNIQUE index on (host_id, slot) over the claims not released makes two
held claims of one slot impossible, whoever writes them: on a ledger several ORCH_HOMEs share
(PostgreSQL, or one SQLite file), two members never hold the same GPU.

`FleetBook` reads and writes them, one short transaction per call (as `host_leases`); a
claim of a job's nodes is one transaction, all its slots or none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from sqlalchemy import Index, Text, column, delete, or_, select, table, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Column, Field, Session, SQLModel

from orchestrator.errors import FleetBusy, FleetError, FleetExists, FleetNotFound
from orchestrator.job_state import FINAL_STATES
from orchestrator.ledger.types import UTCDateTime

if TYPE_CHECKING:
    from orchestrator.ledger.store import Ledger
    from orchestrator.providers.ssh.placement import HostSlots

HELD = text("released_at IS NULL")


def _utc_column(nullable: bool = False) -> Column:
    return Column(UTCDateTime(), nullable=nullable)


class Fleet(SQLModel, table=True):
    """A named set of the user's machines, reached over SSH with the user's key `identity`
    (a path on the machine that added it; orch never copies it)."""

    __tablename__ = "fleet"

    name: str = Field(primary_key=True)
    identity: str  # the private key's path
    known_hosts: str | None = None  # the known_hosts file the host keys were checked against
    price_per_hour: str  # USD, exact decimal text; per `price_unit`
    price_unit: str = "host"  # "host" | "gpu"
    owner: str  # who added it (the owner label)
    created_at: datetime = Field(sa_column=_utc_column())


class FleetHost(SQLModel, table=True):
    """One machine of a fleet as `orch fleet add` found it."""

    __tablename__ = "fleet_host"
    # One machine is in one fleet at most: in two, its GPUs could be handed out twice.
    __table_args__ = (Index("uq_fleet_host_address", "address", "port", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    fleet: str = Field(index=True, foreign_key="fleet.name")
    position: int  # its place in the order the hosts were given, from 0
    user: str
    address: str
    port: int = 22
    proxy_jump: str | None = None  # "user@addr[:port]"
    host_key: str  # "ssh-ed25519 AAAA...", pinned when added
    gpus: str = "[]"  # JSON list of {"index", "name", "memory_mib"}; "[]": a CPU host
    cpus: int
    memory_mib: int
    disk_free_gb: float
    python: str | None = None
    torch: str | None = None
    healthy: bool = True
    health_note: str = ""
    checked_at: datetime = Field(sa_column=_utc_column())

    def gpu_list(self) -> list[dict[str, object]]:
        """`gpus` read, by index."""
        return sorted(json.loads(self.gpus), key=lambda gpu: int(gpu["index"]))

    def slots(self) -> tuple[int, ...]:
        """Its slots: the GPU indices, or 0..cpus-1 on a host without GPUs."""
        gpus = self.gpu_list()
        return tuple(int(gpu["index"]) for gpu in gpus) if gpus else tuple(range(self.cpus))


class FleetClaim(SQLModel, table=True):
    """One slot of one host held by one node of a job (allocation `instance_id`)."""

    __tablename__ = "fleet_claim"
    __table_args__ = (
        Index(
            "uq_fleet_claim_held_slot", "host_id", "slot", unique=True,
            sqlite_where=HELD, postgresql_where=HELD,
        ),
    )  # fmt: skip

    id: int | None = Field(default=None, primary_key=True)
    host_id: int = Field(index=True, foreign_key="fleet_host.id")
    slot: int
    job_id: str = Field(index=True)
    rank: int
    instance_id: str = Field(index=True)
    owner: str
    claimed_at: datetime = Field(sa_column=_utc_column())
    released_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    # The allocation as its provider made it (JSON; "" until made): what `list_owned` answers
    detail: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))


class FleetWaiter(SQLModel, table=True):
    """A job waiting for `nodes` x `slots_per_node` free slots of a fleet, since `since`."""

    __tablename__ = "fleet_waiter"

    job_id: str = Field(primary_key=True)
    fleet: str = Field(index=True, foreign_key="fleet.name")
    nodes: int
    slots_per_node: int
    owner: str
    since: datetime = Field(sa_column=_utc_column())


@dataclass(frozen=True)
class NodeClaim:
    """What one node of a job asks: `slots` of host `host_id`, as allocation `instance_id`."""

    rank: int
    host_id: int
    slots: tuple[int, ...]
    instance_id: str


@dataclass(frozen=True)
class FleetUsage:
    """A fleet's use over a window, in hours: its capacity (`host_hours`: hosts x the hours it
    existed in the window; `slot_hours` the same in slots) and what jobs held of it
    (`held_hours`: host-hours with at least one slot held; `held_slot_hours`)."""

    host_hours: float
    held_hours: float
    slot_hours: float
    held_slot_hours: float

    @property
    def utilization(self) -> float:
        """Held host-hours over capacity (0 for no capacity)."""
        return self.held_hours / self.host_hours if self.host_hours else 0.0


_FLEET = Fleet.__table__  # type: ignore[attr-defined]
# The job table, as far as the queue reads it (its model's module imports this one).
_JOB = table("job", column("id"), column("state"))
_FINAL = sorted(state.value for state in FINAL_STATES)


def _still_waiting() -> ColumnElement[bool]:
    """A waiter's job has not ended (or is not in the ledger's jobs: rows written alone)."""
    return or_(_JOB.c.state.is_(None), _JOB.c.state.not_in(_FINAL))


_HOST = FleetHost.__table__  # type: ignore[attr-defined]
_CLAIM = FleetClaim.__table__  # type: ignore[attr-defined]
_WAITER = FleetWaiter.__table__  # type: ignore[attr-defined]


class FleetBook:
    """Reads and writes of the ledger's fleets; one short transaction per call, no I/O else."""

    def __init__(self, ledger: Ledger) -> None:
        self.engine = ledger.engine

    # --- fleets -------------------------------------------------------------------------
    def add(self, fleet: Fleet, hosts: list[FleetHost]) -> None:
        """Record `fleet` with `hosts`, in their order (`position` and `fleet` are set from
        it; each host's `id` once recorded), in one transaction. `FleetExists` when the name
        is taken; a FleetError when there is no host, a host (address and port) is listed
        twice or is in another fleet already (a unique index holds this against a racing
        `add` too), or the price is not a decimal >= 0 per "host" or "gpu". Nothing is written
        then."""
        _check_price(fleet)
        if not hosts:
            raise FleetError(
                f"fleet {fleet.name} has no host", hint="give each machine with --host USER@ADDR"
            )
        seen: set[tuple[str, int]] = set()
        for host in hosts:
            if (host.address, host.port) in seen:
                raise FleetError(
                    f"host {host.address}:{host.port} is listed twice in fleet {fleet.name}",
                    hint="list each machine once; a machine with many GPUs is one host",
                )
            seen.add((host.address, host.port))
        try:
            with Session(self.engine, expire_on_commit=False) as session:  # the caller's rows
                if session.get(Fleet, fleet.name) is not None:
                    raise _exists(fleet.name)
                _refuse_taken(fleet.name, _fleets_holding(session, seen))
                session.add(fleet)
                session.flush()
                for position, host in enumerate(hosts):
                    host.fleet, host.position = fleet.name, position
                    session.add(host)
                session.commit()
        except IntegrityError as exc:  # another added the same name or hosts meanwhile
            with Session(self.engine) as session:
                _refuse_taken(fleet.name, _fleets_holding(session, seen))
            raise _exists(fleet.name) from exc

    def refuse_taken(self, name: str, hosts: Iterable[tuple[str, int]]) -> None:
        """A FleetError naming each of `hosts` (address, port) that a fleet holds already, for
        the fleet `name` about to be added; nothing when none is."""
        with Session(self.engine) as session:
            _refuse_taken(name, _fleets_holding(session, set(hosts)))

    def get(self, name: str) -> tuple[Fleet, list[FleetHost]]:
        """The fleet `name` and its hosts by position; `FleetNotFound` when there is none."""
        with Session(self.engine) as session:
            fleet = session.get(Fleet, name)
            hosts = session.execute(
                select(FleetHost).where(_HOST.c.fleet == name).order_by(_HOST.c.position)
            )
            found = list(hosts.scalars())
        if fleet is None:
            raise self._not_found(name)
        return fleet, found

    def fleets(self) -> list[Fleet]:
        """Every fleet, by name."""
        with Session(self.engine) as session:
            return list(session.execute(select(Fleet).order_by(_FLEET.c.name)).scalars())

    def remove(self, name: str) -> None:
        """Forget the fleet `name`, its hosts and their released claims. `FleetBusy` (naming
        the jobs) while a claim of its hosts is held or a job waits for it; `FleetNotFound`."""
        try:
            with self.engine.begin() as connection:
                there = connection.execute(select(_FLEET.c.name).where(_FLEET.c.name == name))
                if there.first() is None:
                    raise self._not_found(name)
                hosts = select(_HOST.c.id).where(_HOST.c.fleet == name)
                connection.execute(hosts.order_by(_HOST.c.id).with_for_update())  # see `claim`
                holding = connection.execute(
                    select(_CLAIM.c.job_id).where(_CLAIM.c.host_id.in_(hosts), HELD)
                ).scalars()
                waiting = connection.execute(
                    select(_WAITER.c.job_id)
                    .outerjoin(_JOB, _JOB.c.id == _WAITER.c.job_id)
                    .where(_WAITER.c.fleet == name, _still_waiting())
                ).scalars()
                jobs = sorted({*holding, *waiting})
                if jobs:
                    raise _busy(name, jobs)
                connection.execute(delete(_WAITER).where(_WAITER.c.fleet == name))  # ended ones
                connection.execute(delete(_CLAIM).where(_CLAIM.c.host_id.in_(hosts)))
                connection.execute(delete(_HOST).where(_HOST.c.fleet == name))
                connection.execute(delete(_FLEET).where(_FLEET.c.name == name))
        except IntegrityError as exc:  # a claim or a waiter came meanwhile
            raise _busy(name, [c.job_id for c in self.held(name)] + self._waiting(name)) from exc

    def mark_health(self, host_id: int, healthy: bool, note: str, at: datetime) -> None:
        """Record what the last check of host `host_id` found (an unknown host: nothing)."""
        with self.engine.begin() as connection:
            connection.execute(
                update(_HOST)
                .where(_HOST.c.id == host_id)
                .values(healthy=healthy, health_note=note, checked_at=at)
            )

    # --- claims -------------------------------------------------------------------------
    def claim(
        self, fleet: str, job_id: str, owner: str, nodes: list[NodeClaim], at: datetime
    ) -> list[FleetClaim] | None:
        """Hold every slot of every node of `nodes` for job `job_id`, in one transaction;
        the claims, or None with nothing written when any slot is held already (the unique
        index refuses it, whoever holds it), or a host is unhealthy or not (any more) of
        `fleet`. Raises ValueError for nodes that break the placement rules (two on one host,
        a slot the host does not have, an instance twice)."""
        _check_nodes(nodes)
        rows = [
            FleetClaim(
                host_id=node.host_id, slot=slot, job_id=job_id, rank=node.rank,
                instance_id=node.instance_id, owner=owner, claimed_at=at,
            )
            for node in nodes
            for slot in node.slots
        ]  # fmt: skip
        # One order for every claim's writes (and host locks): two claims each waiting for
        # a slot the other wrote first would deadlock on PostgreSQL.
        rows.sort(key=lambda row: (row.host_id, row.slot))
        wanted = {node.host_id: set(node.slots) for node in nodes}
        try:
            with Session(self.engine, expire_on_commit=False) as session:
                # PostgreSQL: the hosts stay as read (health, fleet) until the commit, and a
                # `remove` (which locks them for update, in the same order) waits or is waited
                # for. SQLite: the first write below takes the database's write lock instead.
                session.execute(
                    select(_HOST.c.id)
                    .where(_HOST.c.id.in_(wanted))
                    .order_by(_HOST.c.id)
                    .with_for_update(read=True)
                )
                session.add_all(rows)
                session.flush()
                hosts = session.execute(
                    select(FleetHost).where(_HOST.c.id.in_(wanted), _HOST.c.fleet == fleet)
                ).scalars()
                usable = {host.id: host for host in hosts if host.healthy}
                if set(usable) != set(wanted):
                    session.rollback()
                    return None
                for host_id, slots in wanted.items():
                    missing = slots - set(usable[host_id].slots())
                    if missing:
                        raise ValueError(f"host {host_id} has no slot(s) {sorted(missing)}")
                session.commit()
        except IntegrityError:  # a slot held already, or a host removed meanwhile
            return None
        return rows

    def describe(self, instance_id: str, detail: str) -> None:
        """Record what allocation `instance_id` is (its provider's JSON) on its claims."""
        with self.engine.begin() as connection:
            connection.execute(
                update(_CLAIM).where(_CLAIM.c.instance_id == instance_id).values(detail=detail)
            )

    def claims_of(self, instance_ids: Iterable[str]) -> list[FleetClaim]:
        """Every claim, held or released, of these allocations."""
        ids = list(instance_ids)
        if not ids:
            return []
        with Session(self.engine) as session:
            return list(
                session.execute(select(FleetClaim).where(_CLAIM.c.instance_id.in_(ids)))
                .scalars()
                .all()
            )

    def release(self, instance_ids: Iterable[str], at: datetime) -> int:
        """Release the held claims of these allocations at `at`; how many (0 when released
        already)."""
        ids = list(instance_ids)
        if not ids:
            return 0
        with self.engine.begin() as connection:
            result = connection.execute(
                update(_CLAIM).where(_CLAIM.c.instance_id.in_(ids), HELD).values(released_at=at)
            )
            return result.rowcount

    def held(self, fleet: str | None = None, job_id: str | None = None) -> list[FleetClaim]:
        """The claims held now (not released), of `fleet`'s hosts and of `job_id` when
        given; by host, then slot."""
        query = select(FleetClaim).where(HELD)
        if fleet is not None:
            query = query.where(
                _CLAIM.c.host_id.in_(select(_HOST.c.id).where(_HOST.c.fleet == fleet))
            )
        if job_id is not None:
            query = query.where(_CLAIM.c.job_id == job_id)
        with Session(self.engine) as session:
            rows = session.execute(query.order_by(_CLAIM.c.host_id, _CLAIM.c.slot))
            return list(rows.scalars())

    def host_slots(self, fleet: str) -> list[HostSlots]:
        """Every host of `fleet` (by position) with its slots, those free now, its health and
        GPU names, for `providers.ssh.placement`; `FleetNotFound`."""
        from orchestrator.providers.ssh.placement import HostSlots

        _, hosts = self.get(fleet)
        taken: dict[int, set[int]] = {}
        for claim in self.held(fleet):
            taken.setdefault(claim.host_id, set()).add(claim.slot)
        found = []
        for host in hosts:
            assert host.id is not None
            slots = host.slots()
            free = tuple(slot for slot in slots if slot not in taken.get(host.id, set()))
            names = tuple(str(gpu["name"]) for gpu in host.gpu_list())
            found.append(HostSlots(host.id, slots, free, host.healthy, names))
        return found

    # --- the queue ----------------------------------------------------------------------
    def wait(self, waiter: FleetWaiter) -> None:
        """Put a job in its fleet's queue (idempotent: a job waiting already keeps its
        place); `FleetNotFound` when the fleet is not there."""
        job_id, fleet = waiter.job_id, waiter.fleet  # the row expires once written
        try:
            with Session(self.engine) as session:
                if session.get(FleetWaiter, job_id) is not None:
                    return
                if session.get(Fleet, fleet) is None:
                    raise self._not_found(fleet)
                session.add(FleetWaiter(**waiter.model_dump()))
                session.commit()
        except IntegrityError:
            if job_id not in {w.job_id for w in self.queue(fleet)}:
                raise self._not_found(fleet) from None

    def stop_waiting(self, job_id: str) -> None:
        """Take the job out of its fleet's queue (nothing when it is not in one)."""
        with self.engine.begin() as connection:
            connection.execute(delete(_WAITER).where(_WAITER.c.job_id == job_id))

    def queue(self, fleet: str) -> list[FleetWaiter]:
        """The jobs waiting for `fleet`, in queue order: by `since`, then job id. A job that
        has ended is not waiting, whatever its row says (a controller killed while its job
        waited could not take it out of the queue)."""
        with Session(self.engine) as session:
            query = (
                select(FleetWaiter)
                .outerjoin(_JOB, _JOB.c.id == _WAITER.c.job_id)
                .where(_WAITER.c.fleet == fleet, _still_waiting())
                .order_by(_WAITER.c.since, _WAITER.c.job_id)
            )
            return list(session.execute(query).scalars())

    def _waiting(self, fleet: str) -> list[str]:
        return [waiter.job_id for waiter in self.queue(fleet)]

    # --- use ----------------------------------------------------------------------------
    def usage(self, fleet: str, start: datetime, end: datetime) -> FleetUsage:
        """How much of `fleet` jobs held between `start` and `end` (give an `end` no later
        than now: a held claim counts until `end`); `FleetNotFound`."""
        record, hosts = self.get(fleet)
        opened = max(start, record.created_at)
        hours = _hours(opened, end)
        slots = sum(len(host.slots()) for host in hosts)
        query = select(FleetClaim).where(
            _CLAIM.c.host_id.in_([host.id for host in hosts]),
            _CLAIM.c.claimed_at < end,
            (_CLAIM.c.released_at.is_(None)) | (_CLAIM.c.released_at > opened),
        )
        with Session(self.engine) as session:
            claims = list(session.execute(query).scalars())
        spans: dict[int, list[tuple[datetime, datetime]]] = {}
        held_slot_hours = 0.0
        for claim in claims:
            since = max(claim.claimed_at, opened)
            until = min(claim.released_at or end, end)
            if until > since:
                spans.setdefault(claim.host_id, []).append((since, until))
                held_slot_hours += _hours(since, until)
        held_hours = sum(_covered(host_spans) for host_spans in spans.values())
        return FleetUsage(len(hosts) * hours, held_hours, slots * hours, held_slot_hours)

    def _not_found(self, name: str) -> FleetNotFound:
        with self.engine.connect() as connection:
            names = list(connection.execute(select(_FLEET.c.name).order_by(_FLEET.c.name)))
        there = ", ".join(row[0] for row in names) or "none"
        return FleetNotFound(
            f"no fleet {name!r} in the ledger (fleets: {there})",
            hint="`orch fleet add NAME --host USER@ADDR ... --identity KEY` records one;"
            " `orch fleet status` lists them",
        )


def _check_nodes(nodes: Sequence[NodeClaim]) -> None:
    hosts = [node.host_id for node in nodes]
    instances = [node.instance_id for node in nodes]
    if len(set(hosts)) != len(hosts) or len(set(instances)) != len(instances):
        raise ValueError(f"one node per host and one allocation per node: {list(nodes)}")
    for node in nodes:
        if not node.slots or len(set(node.slots)) != len(node.slots):
            raise ValueError(f"node {node.rank}: slots must be distinct and some: {node.slots}")


def _check_price(fleet: Fleet) -> None:
    try:
        price = Decimal(fleet.price_per_hour)
    except InvalidOperation:
        price = Decimal("NaN")
    if not price.is_finite() or price < 0 or fleet.price_unit not in ("host", "gpu"):
        raise FleetError(
            f"fleet {fleet.name}: price {fleet.price_per_hour!r} USD per {fleet.price_unit}-hour"
            " is not a price",
            hint="give --price-per-hour or --price-per-gpu-hour as a decimal >= 0, e.g. 2.50",
        )


def _fleets_holding(session: Session, hosts: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Which fleet holds each of `hosts` (address, port) that one holds."""
    if not hosts:
        return {}
    rows = session.execute(
        select(_HOST.c.address, _HOST.c.port, _HOST.c.fleet).where(
            _HOST.c.address.in_(sorted({address for address, _ in hosts}))
        )
    )
    return {(a, p): f for a, p, f in rows if (a, p) in hosts}


def _refuse_taken(name: str, taken: dict[tuple[str, int], str]) -> None:
    if not taken:
        return
    listed = ", ".join(f"{a}:{p} (in fleet {f})" for (a, p), f in sorted(taken.items()))
    verb = "is" if len(taken) == 1 else "are"
    raise FleetError(
        f"{listed} {verb} in another fleet already, and a machine in two fleets could have its "
        f"GPUs handed out twice; fleet {name} was not recorded",
        hint=f"leave such a machine out, or `orch fleet remove {min(taken.values())}` first",
    )


def _exists(name: str) -> FleetExists:
    return FleetExists(
        f"a fleet called {name!r} is in the ledger already; nothing was recorded",
        hint=f"pick another name, or `orch fleet remove {name}` first",
    )


def _busy(name: str, jobs: Sequence[str]) -> FleetBusy:
    shown = ", ".join(sorted(set(jobs))) or "a job"
    return FleetBusy(
        f"fleet {name!r} is in use: job(s) {shown} hold or wait for its hosts; nothing removed",
        hint="`orch cancel JOB` them, or wait for them to end, then remove the fleet again",
    )


def _hours(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0) / 3600


def _covered(spans: list[tuple[datetime, datetime]]) -> float:
    """Hours covered by the union of `spans`."""
    total, reach = 0.0, None
    for since, until in sorted(spans):
        if reach is None or since > reach:
            total += _hours(since, until)
            reach = until
        elif until > reach:
            total += _hours(reach, until)
            reach = until
    return total
