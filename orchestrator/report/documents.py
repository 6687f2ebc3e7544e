"""Documents that read commands print: built from ledger rows, rendered as JSON or tables."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from orchestrator.cluster.checkpoints.store import describe
from orchestrator.config import Settings
from orchestrator.ledger.store import (
    CheckpointRecord,
    Job,
    Ledger,
    hourly_rate,
    lease_cost,
    total_cost,
    utcnow,
)


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _elapsed(job: Job, now: datetime) -> float | None:
    if job.started_at is None:
        return None
    return ((job.ended_at or now) - job.started_at).total_seconds()


def money(value: Decimal) -> float:
    """USD for JSON: exact decimals become numbers only at the edge, for readers' convenience."""
    return float(value)


def checkpoint_document(record: CheckpointRecord, mirror: Path) -> dict[str, Any]:
    """One kept checkpoint: where its bytes are (the mirror on this machine, the store), and
    its files with their digests (and store keys)."""
    files = json.loads(record.files_json) if record.files_json else []
    store = record.store_url if record.stored_at is not None else None
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


def job_document(ledger: Ledger, settings: Settings, job: Job, *, detail: bool = True) -> dict:
    """The JSON view of a job (DESIGN.md: id, state, provider, nodes, gpus_per_node, step,
    spend_usd, checkpoints, recoveries; plus, when `detail`, leases, events, the spec's `env`
    and the names of its `secrets`, never their values)."""
    now = utcnow()
    leases = ledger.leases(job.id)
    checkpoints = ledger.checkpoints(job.id, live_only=True)
    mirror = settings.job_dir(job.id) / "checkpoints"
    doc: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "provider": job.provider,
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
    if detail:
        spec = json.loads(job.spec_json or "{}")  # the public document: secrets' values hidden
        doc["env"] = spec.get("env", {})
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
        doc["events"] = [
            {"at": _time(e.at), "kind": e.kind, "message": e.message, "step": e.step}
            for e in ledger.events(job.id)
        ]
    return doc


def cost_document(ledger: Ledger, job_id: str | None = None) -> dict:
    """Spend per job, per kept cluster (its jobs and its idle time between them) and in
    total, from the leases' recorded prices; with `job_id`, that job's alone."""
    from orchestrator.ledger.clusters import Clusters
    from orchestrator.report.clusters import clusters_document

    now = utcnow()
    jobs = [ledger.get_job(job_id)] if job_id else ledger.jobs()
    rows = []
    total = Decimal(0)
    for job in jobs:
        leases = ledger.leases(job.id)
        spend = total_cost(leases, now)
        total += spend
        node_seconds = sum(
            ((lease.ended_at or now) - lease.launched_at).total_seconds() for lease in leases
        )
        rows.append(
            {
                "id": job.id,
                "state": job.state,
                "provider": job.provider,
                "leases": len(leases),
                "node_hours": node_seconds / 3600,
                "spend_usd": money(spend),
                "running": any(lease.ended_at is None for lease in leases),
            }
        )
    clusters = [] if job_id else clusters_document(ledger, now, up_only=False)
    idle = Clusters(ledger)
    total += sum((idle.idle_cost(c["id"], now) for c in clusters), Decimal(0))
    return {"jobs": rows, "clusters": clusters, "total_usd": money(total)}
