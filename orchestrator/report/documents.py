"""Documents that read commands print: built from ledger rows, rendered as JSON or tables.

The list views' documents (`job_summary`, `cost_from`, and `report.clusters`) take the reads
they need as arguments, so that the same code builds them from the SQLModel ledger or from the
read-only sqlite3 view (`ledger.view`) that `orch status` and `orch cost` start with; this
module imports neither SQLModel nor the configuration's models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.job_state import JobState
from orchestrator.ledger.measures import hourly_rate, lease_cost, total_cost, utcnow
from orchestrator.ledger.sharing import shown_env

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.ledger.rows import (
        CheckpointRow,
        ClusterRow,
        EventRow,
        GpuSampleRow,
        HostLeaseRow,
        IdleLeaseRow,
        JobBill,
        JobDetailRow,
        JobRow,
        LeaseRow,
    )
    from orchestrator.ledger.store import (
        CheckpointRecord,
        Event,
        GpuSampleRecord,
        HostLease,
        IdleLease,
        Job,
        KeptCluster,
        Lease,
        Ledger,
    )


class JobReads(Protocol):
    """The reads of jobs the list views make: `store.Ledger`'s, or `view.LedgerView`'s."""

    def jobs(self, *, limit: int | None = None) -> Sequence[Job | JobRow]: ...
    def get_job(self, job_id: str) -> Job | JobRow: ...
    def leases(self, job_id: str | None = None) -> Sequence[Lease | LeaseRow]: ...
    def checkpoints(
        self, job_id: str, *, live_only: bool = False
    ) -> Sequence[CheckpointRecord | CheckpointRow]: ...


class DetailReads(JobReads, Protocol):
    """The reads of one job's view: `store.Ledger`'s, or `view.LedgerView`'s."""

    def events(self, job_id: str) -> Sequence[Event | EventRow]: ...
    def latest_gpu_samples(self, job_id: str) -> Sequence[GpuSampleRecord | GpuSampleRow]: ...


class ListReads(Protocol):
    """The reads of `orch status`'s list (`view.LedgerView`'s): a bounded number of reads
    whatever the number of jobs."""

    def jobs(
        self, *, limit: int | None = None, since: datetime | None = None
    ) -> Sequence[JobRow]: ...
    def live_jobs(self) -> Sequence[JobRow]: ...
    def job_count(self, *, since: datetime | None = None) -> int: ...
    def leases_of(self, job_ids: Sequence[str]) -> Mapping[str, Sequence[LeaseRow]]: ...
    def checkpoints_of(
        self, job_ids: Sequence[str], *, live_only: bool = False
    ) -> Mapping[str, Sequence[CheckpointRow]]: ...
    def fleet_queues(self) -> Mapping[str, Mapping[str, Any]]: ...


class CostReads(JobReads, Protocol):
    """The reads `orch cost` makes: `JobReads`, every job's (id, state, provider) and every
    job's bill, each in one read."""

    def job_heads(
        self, *, limit: int | None = None, since: datetime | None = None
    ) -> Sequence[tuple[str, str, str]]: ...
    def job_bills(self, now: datetime) -> Mapping[str, JobBill]: ...
    def host_leases(self) -> Sequence[HostLeaseRow]: ...


class ClusterReads(Protocol):
    """The reads of kept clusters the list views make: `ledger.clusters.Clusters`'s, or
    `view.ClustersView`'s."""

    def all(self, *, up_only: bool = False) -> Sequence[KeptCluster | ClusterRow]: ...
    def jobs(self, cluster_id: str) -> Sequence[Job | JobRow]: ...
    def idle_leases(self, cluster_id: str) -> Sequence[IdleLease | IdleLeaseRow]: ...


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _elapsed(job: Job | JobRow, now: datetime) -> float | None:
    if job.started_at is None:
        return None
    return ((job.ended_at or now) - job.started_at).total_seconds()


def money(value: Decimal) -> float:
    """USD for JSON: exact decimals become numbers only at the edge, for readers' convenience."""
    return float(value)


def checkpoint_document(record: CheckpointRecord | CheckpointRow, mirror: Path) -> dict[str, Any]:
    """One kept checkpoint: where its bytes are (the mirror on this machine, the store), and
    its files with their digests (and store keys)."""
    files = json.loads(record.files_json) if record.files_json else []
    store = record.store_url if record.stored_at is not None else None
    if store and any(f.get("key") for f in files):
        from orchestrator.cluster.checkpoints.store import describe
    return {
        "name": record.name,
        "kind": record.kind,
        "step": record.step,
        "size_bytes": record.size_bytes,
        "digest": record.digest,
        "pulled_at": _time(record.pulled_at),
        "path": str(mirror / record.name) if record.in_mirror else None,
        "stored": store is not None,
        "stored_at": _time(record.stored_at),
        "files": [
            {**f, "url": describe(store, f["key"]) if store and f.get("key") else None}
            for f in files
        ],
    }


def job_summary(
    job: Job | JobRow,
    leases: Sequence[Lease | LeaseRow],
    checkpoints: Sequence[CheckpointRecord | CheckpointRow],
    mirror: Path,
    now: datetime,
) -> dict[str, Any]:
    """A job as lists show it (`job_document` without `detail`): its live checkpoints'
    copies on this machine lie under `mirror`."""
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "provider": job.provider,
        "owner": job.owner,  # who submitted it (a label: `Settings.owner_label`)
        "nodes": job.nodes,
        "gpus_per_node": job.gpus_per_node,
        "step": job.step,
        "loss": job.loss,
        "spend_usd": money(total_cost(leases, now)),
        "hourly_usd": money(hourly_rate(leases)),
        "elapsed_s": _elapsed(job, now),
        "recoveries": job.recoveries,
        "switches": job.switches,  # planned moves of the spot policy (not recoveries)
        "created_at": _time(job.created_at),
        "started_at": _time(job.started_at),
        "ended_at": _time(job.ended_at),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "checkpoints": [checkpoint_document(c, mirror) for c in checkpoints],
    }


def job_document(
    ledger: DetailReads, settings: Settings, job: Job | JobDetailRow, *, detail: bool = True
) -> dict:
    """The JSON view of a job (DESIGN.md: id, state, provider, nodes, gpus_per_node, step,
    spend_usd, checkpoints, recoveries; plus, when `detail`, leases, events, the spec's `env`
    and the names of its `secrets`, never their values, and while it runs `checkpoint_alerts`:
    checkpoint files going without a copy, see `capture_alerts`)."""
    now = utcnow()
    leases = ledger.leases(job.id)
    checkpoints = ledger.checkpoints(job.id, live_only=True)
    doc = job_summary(job, leases, checkpoints, settings.job_dir(job.id) / "checkpoints", now)
    if detail:
        spec = json.loads(job.spec_json or "{}")  # the public document: secrets' values hidden
        doc["env"] = shown_env(spec, settings.job_dir(job.id))  # a shared ledger: names only
        doc["secrets"] = sorted(spec.get("secrets", {}))  # names only
        doc["gpus"] = [
            {
                "node": sample.rank,
                "gpu": sample.gpu,  # -1: no GPU on the node, CPU % of the job's processes
                "util_pct": sample.util_pct,
                "mem_used_mib": sample.mem_used_mib,
                "mem_total_mib": sample.mem_total_mib,
                "known": sample.ok,
                "at": _time(sample.at),
            }
            for sample in ledger.latest_gpu_samples(job.id)
        ]
        doc["leases"] = [
            {
                "instance_id": lease.instance_id,
                "cluster": lease.cluster,
                "rank": lease.rank,
                "market": lease.market,
                "instance_type": lease.instance_type,
                "price_per_hour": money(lease.price_per_hour),
                "launched_at": _time(lease.launched_at),
                "ended_at": _time(lease.ended_at),
                "cost_usd": money(lease_cost(lease, now)),
            }
            for lease in leases
        ]
        events = ledger.events(job.id)
        doc["events"] = [
            {"at": _time(e.at), "kind": e.kind, "message": e.message, "step": e.step}
            for e in events
        ]
        doc["outputs"] = outputs_document(spec, doc["events"])
        # Checkpoint files going without a copy (a WARNING each): the line `orch status` shows.
        from orchestrator.cluster.checkpoints.capture_alerts import active_alerts

        live = not JobState(job.state).is_final
        doc["checkpoint_alerts"] = (
            active_alerts((e.kind, e.message) for e in events) if live else []
        )
    return doc


def outputs_document(spec: dict, events: Sequence[dict]) -> list[dict]:
    """The spec's `outputs`, each with its OUTPUTS events (what each node uploaded, when and
    why, or why it could not), oldest first."""
    outputs = spec.get("outputs") or []
    found: list[dict] = []
    for i, output in enumerate(outputs if isinstance(outputs, list) else []):
        if not isinstance(output, dict):
            continue
        mine = f"outputs[{i}] "
        uploads = [
            {"at": e["at"], "message": e["message"]}
            for e in events
            if e["kind"] == "OUTPUTS"
            and (e["message"].startswith(mine) or not e["message"].startswith("outputs["))
        ]
        found.append(
            {
                "src": output.get("src"),
                "dst": output.get("dst"),
                "nodes": output.get("nodes", "head"),
                "uploads": uploads,
            }
        )
    return found


STATUS_LIMIT = 50  # the newest jobs `orch status` lists (older unfinished ones besides)


def jobs_list(ledger: ListReads, home: Path, now: datetime, *, limit: int = 50) -> list[dict]:
    """The newest `limit` jobs as `orch status` lists them: each is its
    `job_document(..., detail=False)`. `home` is ORCH_HOME (`Settings.home`): a job's
    checkpoint mirror is `Settings.job_dir(id) / "checkpoints"`."""
    return listed_jobs(ledger, ledger.jobs(limit=limit), home, now)


def status_list(
    ledger: ListReads,
    home: Path,
    now: datetime,
    *,
    limit: int | None = None,
    since: datetime | None = None,
) -> tuple[list[dict], int]:
    """`orch status`'s jobs and how many it leaves out, in a bounded number of reads whatever
    the number of jobs. Without `limit` or `since`: the newest `STATUS_LIMIT` jobs, then every
    unfinished job older than those, newest first, so a long run stays in sight however many
    jobs came after it; left out: the other, finished, jobs. With either (a page for
    scripts): the jobs created at or after `since`, newest first, at most `limit`; left out:
    the others created since then."""
    if limit is None and since is None:
        newest = ledger.jobs(limit=STATUS_LIMIT)
        shown = {job.id for job in newest}
        jobs = [*newest, *(job for job in ledger.live_jobs() if job.id not in shown)]
    else:
        jobs = ledger.jobs(limit=limit, since=since)
    listed = listed_jobs(ledger, jobs, home, now)
    return listed, max(0, ledger.job_count(since=since) - len(listed))


def listed_jobs(ledger: ListReads, jobs: Sequence[JobRow], home: Path, now: datetime) -> list[dict]:
    """`jobs` as lists show them (`job_summary`), their leases and live checkpoints read in
    one read each."""
    ids = [job.id for job in jobs]
    leases = ledger.leases_of(ids)
    checkpoints = ledger.checkpoints_of(ids, live_only=True)
    queues = ledger.fleet_queues()
    return [
        {
            **job_summary(
                job,
                leases.get(job.id, []),
                checkpoints.get(job.id, []),
                home / "jobs" / job.id / "checkpoints",
                now,
            ),
            # only while it waits in a fleet's queue: {fleet, position, of}
            **({"queue": dict(queues[job.id])} if job.id in queues else {}),
        }
        for job in jobs
    ]


def cost_document(ledger: Ledger, job_id: str | None = None) -> dict:
    """Spend per job, per kept cluster (its jobs and its idle time between them) and in
    total, from the leases' recorded prices; with `job_id`, that job's alone. Read through
    the ledger's read model (rows, not model objects, whatever the number of jobs)."""
    from orchestrator.ledger.view import LedgerView

    with LedgerView.of_engine(ledger.engine) as view:
        return cost_from(view, view.clusters, utcnow(), job_id)


def cost_from(
    ledger: CostReads,
    clusters: ClusterReads,
    now: datetime,
    job_id: str | None = None,
    *,
    limit: int | None = None,
    since: datetime | None = None,
) -> dict:
    """`cost_document` from a view of the ledger (`view.LedgerView`) and its kept `clusters`,
    at `now`. Every job's bill is two reads in all (`job_heads`, `job_bills`), not one per
    job. `limit` and `since` (a page for scripts) keep the rows of the jobs created at or
    after `since`, newest first, at most `limit`; the clusters, hosts and `total_usd` are the
    whole ledger's whatever the page."""
    from orchestrator.ledger.rows import NO_BILL, bills_of
    from orchestrator.report.clusters import clusters_from

    if job_id:
        job = ledger.get_job(job_id)
        heads: Sequence[tuple[str, str, str]] = [(job.id, job.state, job.provider)]
        bills: Mapping[str, JobBill] = bills_of(ledger.leases(job_id), now)
    else:
        heads, bills = ledger.job_heads(limit=limit, since=since), ledger.job_bills(now)
    rows = []
    total = Decimal(0)
    for head_id, state, provider in heads:
        bill = bills.get(head_id, NO_BILL)
        total += bill.spend
        rows.append(
            {
                "id": head_id,
                "state": state,
                "provider": provider,
                "leases": bill.leases,
                "node_hours": bill.node_seconds / 3600,
                "spend_usd": money(bill.spend),
                "running": bill.running,
            }
        )
    if job_id is None and (limit or since):  # a page: the total is still every job's
        total = sum((bill.spend for bill in bills.values()), Decimal(0))
    kept = [] if job_id else clusters_from(ledger, clusters, now, up_only=False)
    total += sum((total_cost(clusters.idle_leases(c["id"]), now) for c in kept), Decimal(0))
    hosts = [] if job_id else ledger.host_leases()
    total += total_cost(hosts, now)
    return {
        "jobs": rows,
        "clusters": kept,
        "hosts": [host_line(host, now) for host in hosts],
        "total_usd": money(total),
    }


def host_line(host: HostLease | HostLeaseRow, now: datetime) -> dict[str, Any]:
    """A launched controller host's own line of the bill (billed to no job): from its launch
    to its end, or to `now` while it runs."""
    end = host.ended_at or now
    return {
        "instance_id": host.instance_id,
        "provider": host.provider,
        "host": host.host,
        "price_per_hour": str(host.price_per_hour),
        "launched_at": _time(host.launched_at),
        "ended_at": _time(host.ended_at),
        "running": host.ended_at is None,
        "hours": max(0.0, (end - host.launched_at).total_seconds()) / 3600,
        "spend_usd": money(total_cost([host], now)),
    }
