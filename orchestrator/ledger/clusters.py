"""Kept clusters in the ledger: which are up, which job holds each, and their idle bill.

A kept cluster's nodes bill every second of their life. While a job holds the cluster, its
nodes' seconds are that job's leases (`Lease`); between jobs they are the cluster's own idle
leases (`IdleLease`). `hold` and `release` move the bill from one to the other at one instant,
so no second is billed twice or lost. Ending a node (`Ledger.close_leases`) closes both kinds.

Each cluster records the machine that made it (`KeptCluster.machine`, its owner). On a shared
ledger names are that machine's: two machines may each have an UP cluster `dev`, and a name
is looked up among one machine's clusters (`up(name, machine=...)`).
"""

from __future__ import annotations

import secrets
from datetime import datetime
from decimal import Decimal

from sqlmodel import Session, select

from orchestrator.errors import SpecError
from orchestrator.ledger.measures import DOWN as DOWN
from orchestrator.ledger.measures import UP as UP
from orchestrator.ledger.measures import autostop_left as autostop_left
from orchestrator.ledger.measures import holder as holder
from orchestrator.ledger.store import IdleLease, Job, KeptCluster, Ledger, total_cost


def new_cluster_id(name: str) -> str:
    """The owner id of a new cluster called `name`: its nodes' tags, key and directories."""
    return f"{name}-{secrets.token_hex(3)}"


class Clusters:
    """Reads and writes of the ledger's kept clusters; one short transaction per call."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.engine = ledger.engine

    def up(self, name: str, *, machine: str | None = None) -> KeptCluster | None:
        """The cluster called `name` that is UP, if any; with `machine`, only among the
        clusters of that machine (names on a shared ledger); without, any machine's."""
        with Session(self.engine) as session:
            query = select(KeptCluster).where(KeptCluster.name == name, KeptCluster.state == UP)
            if machine is not None:
                query = query.where(KeptCluster.machine == machine)
            return session.exec(query.order_by(KeptCluster.created_at)).first()  # type: ignore[arg-type]

    def get(self, cluster_id: str) -> KeptCluster:
        with Session(self.engine) as session:
            return _row(session, cluster_id)

    def all(self, *, up_only: bool = False) -> list[KeptCluster]:
        with Session(self.engine) as session:
            query = select(KeptCluster).order_by(KeptCluster.created_at.desc())  # type: ignore[attr-defined]
            if up_only:
                query = query.where(KeptCluster.state == UP)
            return list(session.exec(query))

    def create(
        self,
        name: str,
        *,
        provider: str,
        nodes: int,
        gpus_per_node: int,
        autostop_s: float | None,
        now: datetime,
        machine: str | None = None,
    ) -> KeptCluster:
        """Record a new cluster UP (before its nodes launch: intent first), owned by
        `machine` (the machine id of the ORCH_HOME making it)."""
        cluster = KeptCluster(
            id=new_cluster_id(name), name=name, provider=provider, nodes=nodes,
            gpus_per_node=gpus_per_node, autostop_s=autostop_s, created_at=now, machine=machine,
        )  # fmt: skip
        with Session(self.engine, expire_on_commit=False) as session:
            session.add(cluster)
            session.commit()
        return cluster

    def update(self, cluster_id: str, **fields: object) -> KeptCluster:
        with Session(self.engine, expire_on_commit=False) as session:
            cluster = _row(session, cluster_id)
            for key, value in fields.items():
                setattr(cluster, key, value)
            session.add(cluster)
            session.commit()
            return cluster

    def hold(self, cluster_id: str, job_id: str, at: datetime) -> None:
        """Job `job_id` takes the cluster at `at`: its idle leases close then (the job's own
        leases open at the same instant)."""
        with Session(self.engine) as session:
            cluster = _row(session, cluster_id)
            cluster.job_id, cluster.idle_since = job_id, None
            session.add(cluster)
            for lease in self._open_idle(session, cluster_id):
                lease.ended_at = at
                session.add(lease)
            session.commit()

    def release(self, cluster_id: str, nodes: list[tuple[str, int, Decimal]], at: datetime) -> None:
        """The cluster's job let it go at `at`: `nodes` ((instance id, rank, USD per hour))
        bill to the cluster from then on, until the next job holds it or they end."""
        with Session(self.engine) as session:
            cluster = _row(session, cluster_id)
            cluster.job_id, cluster.idle_since = None, at
            session.add(cluster)
            open_ids = {lease.instance_id for lease in self._open_idle(session, cluster_id)}
            for instance_id, rank, price in nodes:
                if instance_id not in open_ids:
                    session.add(
                        IdleLease(
                            cluster_id=cluster_id,
                            instance_id=instance_id,
                            rank=rank,
                            price_per_hour=price,
                            launched_at=at,
                        )  # fmt: skip
                    )
            session.commit()

    def down(self, cluster_id: str, at: datetime, reason: str) -> None:
        """The cluster's nodes are gone (at `at`): DOWN, and its idle leases closed then."""
        with Session(self.engine) as session:
            cluster = session.get(KeptCluster, cluster_id)
            if cluster is None or cluster.state == DOWN:
                return
            cluster.state, cluster.ended_at, cluster.reason = DOWN, at, reason
            cluster.job_id = None
            session.add(cluster)
            for lease in self._open_idle(session, cluster_id):
                lease.ended_at = max(at, lease.launched_at)
                session.add(lease)
            session.commit()

    @staticmethod
    def _open_idle(session: Session, cluster_id: str) -> list[IdleLease]:
        query = select(IdleLease).where(
            IdleLease.cluster_id == cluster_id,
            IdleLease.ended_at.is_(None),  # type: ignore[union-attr]
        )
        return list(session.exec(query))

    def idle_leases(self, cluster_id: str) -> list[IdleLease]:
        with Session(self.engine) as session:
            query = select(IdleLease).where(IdleLease.cluster_id == cluster_id)
            return list(session.exec(query.order_by(IdleLease.id)))  # type: ignore[arg-type]

    def jobs(self, cluster_id: str) -> list[Job]:
        """The jobs that ran (or wait to run) on the cluster, oldest first."""
        with Session(self.engine) as session:
            query = select(Job).where(Job.cluster_id == cluster_id)
            return list(session.exec(query.order_by(Job.created_at)))  # type: ignore[arg-type]

    def idle_cost(self, cluster_id: str, now: datetime) -> Decimal:
        return total_cost(self.idle_leases(cluster_id), now)


def _row(session: Session, cluster_id: str) -> KeptCluster:
    """The cluster row `cluster_id` in `session`; `SpecError` when the ledger has none."""
    cluster = session.get(KeptCluster, cluster_id)
    if cluster is None:
        raise SpecError(
            f"no kept cluster {cluster_id!r} in the ledger", hint="`orch status` lists them"
        )
    return cluster
