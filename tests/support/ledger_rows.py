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
from orchestrator.ledger.store import CheckpointRecord, Event, Job, Lease, Ledger

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


def add_events(ledger: Ledger, job_id: str, rows: list[tuple[float, str, str, int | None]]) -> None:
    """Events of a job at the given seconds after T0: (seconds, kind, message, step)."""
    from sqlmodel import Session

    with Session(ledger.engine) as session:
        session.add_all(
            Event(job_id=job_id, at=at(s), kind=kind, message=message, step=step)
            for s, kind, message, step in rows
        )
        session.commit()


def add_recovered_job(ledger: Ledger, job_id: str, *, pulls: int = 40) -> None:
    """A SUCCEEDED job of a tutorial-style script (rank 0 saves `snapshot.pt` in place) that
    lost node 0 once and resumed: `pulls` CHECKPOINT events before the loss and as many after
    it, its recovery's events between, and its live `snapshot.pt` record."""
    add_job(ledger, job_id, JobState.SUCCEEDED, 0, started_at=at(30), ended_at=at(900),
            step=400, exit_code=0, recoveries=1)  # fmt: skip
    rows: list[tuple[float, str, str, int | None]] = [
        (1, "PROVISIONING", "launching 2 node(s)", None),
        (20, "SYNCING", "workdir to 2 node(s)", None),
        (30, "RUNNING", "torchrun on 2 node(s)", None),
    ]
    rows += [(40 + i, "CHECKPOINT", "pulled snapshot.pt (4096 bytes)", 5 * i) for i in range(pulls)]
    rows += [
        (300, "PREEMPTED", "preempted: node 0 (i-0) taken by the provider", 200),
        (302, "SALVAGED", "newest checkpoint snapshot.pt (pulled at step 195, 4 s old), "
                          "2.0 s after detection", 195),
        (303, "RECOVERING", "recovery 1 of 3: replacing 1 lost node(s)", 200),
        (304, "PROVISIONING", "launching 1 node(s)", 200),
        (330, "SYNCING", "workdir to 2 node(s)", 200),
        (340, "RUNNING", "torchrun on 2 node(s)", 200),
        (341, "RESUMED", "from the checkpoint files put back: snapshot.pt (pulled at step "
                         "195, 39 s old)", None),
    ]  # fmt: skip
    rows += [(350 + i, "CHECKPOINT", "pulled snapshot.pt (4096 bytes)", 200 + 5 * i)
             for i in range(pulls)]  # fmt: skip
    rows += [(890, "STOPPING", "SUCCEEDED: finished", 400), (900, "SUCCEEDED", "", 400)]
    add_events(ledger, job_id, rows)
    ledger.add_checkpoint(
        CheckpointRecord(job_id=job_id, name="snapshot.pt", step=395, size_bytes=4096,
                         pulled_at=at(350 + pulls - 1), kind="file", digest="s1")
    )  # fmt: skip
