"""One ledger's worth of rows of every kind, the same on any database: jobs in every state with
leases and checkpoints, and kept clusters idle, held and down (`fill`). The documents read from
it are compared at the instant `NOW`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import CheckpointRecord, Job, Lease, Ledger

T0 = datetime(2026, 12, 6, 9, 0, 0, 250_000, tzinfo=UTC)
NOW = T0 + timedelta(hours=3, seconds=7.5)  # every document is read at this instant
PRICE = Decimal("1.80")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def add_job(ledger: Ledger, job_id: str, state: str, start: float, **fields: object) -> None:
    ledger.add_job(
        Job(
            id=job_id, name=job_id.split("-")[0], state=state, provider="local", nodes=2,
            gpus_per_node=1, spec_json='{"env": {"A": "1"}}', spec_path="job.yaml",
            created_at=at(start), **fields,
        )
    )  # fmt: skip


def lease(job_id: str, instance: str, rank: int, start: float, **fields: object) -> Lease:
    return Lease(
        job_id=job_id, cluster=job_id, provider="local", instance_id=instance, rank=rank,
        market="spot", instance_type="local-1x", price_per_hour=PRICE, launched_at=at(start),
        **fields,
    )  # fmt: skip


def fill(ledger: Ledger, store_dir: Path) -> None:
    """Jobs of every kind, their leases and checkpoints, and three kept clusters: one idle
    (open idle leases, autostop not yet due), one held by a running job with another queued,
    one down."""
    clusters = Clusters(ledger)
    add_job(ledger, "done-1", JobState.SUCCEEDED, 0, started_at=at(20), ended_at=at(1200),
            step=480, loss=0.125, exit_code=0)  # fmt: skip
    ledger.open_lease(lease("done-1", "i-d0", 0, 5, ended_at=at(1200)))
    ledger.open_lease(lease("done-1", "i-d1", 1, 5, ended_at=at(1201.5)))
    for n, extra in enumerate(
        [
            {"in_mirror": True},
            {"in_mirror": False, "pruned_at": at(900)},  # dropped: not listed
            {
                "in_mirror": False, "stored_at": at(1000), "store_url": f"file://{store_dir}",
                "files_json": json.dumps([{"path": "w.pt", "digest": "ab", "size": 3,
                                           "key": "done-1/w.pt@ab"}]),
            },
        ]
    ):  # fmt: skip
        ledger.add_checkpoint(
            CheckpointRecord(
                job_id="done-1", name=f"step-{n:06d}", step=n * 100, size_bytes=3,
                pulled_at=at(500 + n), kind="step", digest=f"d{n}", **extra,
            )
        )  # fmt: skip
    add_job(ledger, "failed-1", JobState.FAILED, 10, started_at=at(30), ended_at=at(40),
            exit_code=1, reason="boom: CUDA out of memory (simulated)", recoveries=2,
            switches=1)  # fmt: skip
    add_job(ledger, "never-1", JobState.PENDING, 20)

    idle = clusters.create("idle", provider="local", nodes=2, gpus_per_node=1,
                           autostop_s=86_400.0, now=at(100))  # fmt: skip
    add_job(ledger, "kept-1", JobState.SUCCEEDED, 110, started_at=at(120), ended_at=at(300),
            cluster_id=idle.id)  # fmt: skip
    clusters.hold(idle.id, "kept-1", at(120))
    for rank, instance in enumerate(("i-k0", "i-k1")):
        ledger.open_lease(lease("kept-1", instance, rank, 120))
    ledger.close_leases(["i-k0", "i-k1"], at(300))
    clusters.release(idle.id, [("i-k0", 0, PRICE), ("i-k1", 1, PRICE)], at(300))

    busy = clusters.create("busy", provider="local", nodes=1, gpus_per_node=1,
                           autostop_s=None, now=at(400))  # fmt: skip
    add_job(ledger, "run-1", JobState.RUNNING, 410, started_at=at(420), step=7,
            cluster_id=busy.id)  # fmt: skip
    clusters.hold(busy.id, "run-1", at(420))
    ledger.open_lease(lease("run-1", "i-b0", 0, 420))
    add_job(ledger, "queued-1", JobState.PENDING, 430, cluster_id=busy.id)

    gone = clusters.create("gone", provider="local", nodes=1, gpus_per_node=1,
                           autostop_s=600.0, now=at(500))  # fmt: skip
    clusters.release(gone.id, [("i-g0", 0, PRICE)], at(500))
    ledger.close_leases(["i-g0"], at(1500))
    clusters.down(gone.id, at(1500), "autostop")
