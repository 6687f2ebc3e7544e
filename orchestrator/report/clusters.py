"""The kept clusters as `orch status` and `orch cost` show them: nodes, price, idle time, the
time left before autostop, the queue, and the bill split into its jobs and its idle time.

Built from either reader, like the other list views (`report.documents`): `cluster_document`
and `clusters_document` read the SQLModel ledger, `clusters_from` whatever reads it is given.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from orchestrator.job_state import JobState
from orchestrator.ledger.measures import UP, autostop_left, holder, total_cost
from orchestrator.report.documents import ClusterReads, JobReads, money

if TYPE_CHECKING:
    from orchestrator.ledger.rows import ClusterRow
    from orchestrator.ledger.store import KeptCluster, Ledger


def cluster_document(ledger: Ledger, cluster: KeptCluster, now: datetime) -> dict[str, Any]:
    """One kept cluster, read from the SQLModel ledger (`cluster_summary`)."""
    from orchestrator.ledger.clusters import Clusters

    return cluster_summary(ledger, Clusters(ledger), cluster, now)


def clusters_document(ledger: Ledger, now: datetime, *, up_only: bool) -> list[dict[str, Any]]:
    from orchestrator.ledger.clusters import Clusters

    return clusters_from(ledger, Clusters(ledger), now, up_only=up_only)


def clusters_from(
    ledger: JobReads, clusters: ClusterReads, now: datetime, *, up_only: bool
) -> list[dict[str, Any]]:
    """Every kept cluster (the UP ones with `up_only`), newest first, from either reader."""
    return [
        cluster_summary(ledger, clusters, cluster, now) for cluster in clusters.all(up_only=up_only)
    ]


def cluster_summary(
    ledger: JobReads, clusters: ClusterReads, cluster: KeptCluster | ClusterRow, now: datetime
) -> dict[str, Any]:
    """One kept cluster. Its bill is every second of its nodes: the jobs' leases on them plus
    its own idle leases between jobs."""
    jobs = clusters.jobs(cluster.id)
    idle = clusters.idle_leases(cluster.id)
    job_leases = {job.id: ledger.leases(job.id) for job in jobs}
    open_prices = {
        lease.instance_id: lease.price_per_hour
        for lease in [*idle, *(lease for leases in job_leases.values() for lease in leases)]
        if lease.ended_at is None
    }
    jobs_usd = sum((total_cost(leases, now) for leases in job_leases.values()), Decimal(0))
    idle_usd = total_cost(idle, now)
    idle_s = (now - cluster.idle_since).total_seconds() if cluster.idle_since else None
    idle_s_total = sum(
        ((lease.ended_at or now) - lease.launched_at).total_seconds() for lease in idle
    )
    running = holder(ledger, cluster)
    return {
        "name": cluster.name,
        "id": cluster.id,
        "state": cluster.state,
        "provider": cluster.provider,
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "hourly_usd": money(sum(open_prices.values(), Decimal(0))),
        "job": running,
        "queue": [job.id for job in jobs if job.state == JobState.PENDING and job.id != running],
        "idle_s": idle_s if cluster.state == UP else None,
        "autostop_s": cluster.autostop_s,
        "autostop_left_s": autostop_left(cluster, now) if cluster.state == UP else None,
        "jobs": [job.id for job in jobs],
        "jobs_usd": money(jobs_usd),
        "idle_usd": money(idle_usd),
        "idle_node_hours": idle_s_total / 3600,
        "total_usd": money(jobs_usd + idle_usd),
        "created_at": cluster.created_at.isoformat(),
        "ended_at": cluster.ended_at.isoformat() if cluster.ended_at else None,
        "reason": cluster.reason,
    }
