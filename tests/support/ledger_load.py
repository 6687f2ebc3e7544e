"""Load on the ledger from another process: a writer that works like a controller, a reader.

    python -m tests.support.ledger_load write DB_PATH SECONDS
    python -m tests.support.ledger_load read DB_PATH SECONDS

The writer, as fast as it can: each round is one job's life in the order the controller writes
it (intent first): the job, its two leases and an event in ONE transaction; then events, GPU
samples and a checkpoint; then the leases closed; then the job's final state. It prints
`ready` once the ledger is open, then `round N` as each round is complete. The reader runs
what `orch status` reads, in a loop, and prints `reads N` and then every error it met, one
per line.
Used by tests/integration/test_ledger_crash.py, which also kills the writer with SIGKILL.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from decimal import Decimal

from sqlmodel import Session

from orchestrator.job_state import JobState
from orchestrator.ledger.store import (
    CheckpointRecord,
    Event,
    GpuSampleRecord,
    Job,
    Lease,
    Ledger,
    make_engine,
    utcnow,
)

PAYLOAD = "x" * 2000  # long messages widen the window in which a kill lands mid-write


def one_round(ledger: Ledger, tag: str, index: int) -> None:
    job_id = f"crash-{tag}-{index}"
    now = utcnow()
    with Session(ledger.engine) as session:  # register + launch: all or nothing
        session.add(
            Job(id=job_id, name="crash", state=JobState.PROVISIONING, provider="local",
                nodes=2, gpus_per_node=1, spec_json="{}", spec_path="job.yaml", created_at=now)
        )  # fmt: skip
        session.flush()
        for rank in range(2):
            session.add(
                Lease(job_id=job_id, cluster=job_id, provider="local",
                      instance_id=f"i-{tag}-{index}-{rank}", rank=rank, market="on-demand",
                      instance_type="local-1x", price_per_hour=Decimal("0.25"), launched_at=now)
            )  # fmt: skip
        session.add(Event(job_id=job_id, at=now, kind="LAUNCHED", message=PAYLOAD))
        session.commit()
    ledger.update_job(job_id, state=JobState.RUNNING, started_at=utcnow())
    for step in range(3):
        ledger.add_event(job_id, "PROGRESS", PAYLOAD, step=step)
    ledger.add_gpu_samples(
        GpuSampleRecord(job_id=job_id, rank=r, gpu=0, at=utcnow(), util_pct=50.0) for r in (0, 1)
    )
    ledger.add_checkpoint(
        CheckpointRecord(
            job_id=job_id, name="step-000001", step=1, size_bytes=1, pulled_at=utcnow()
        )
    )
    ledger.update_job(job_id, state=JobState.STOPPING, stop_state=JobState.SUCCEEDED.value)
    ended = utcnow() + timedelta(microseconds=1)
    ledger.close_leases([f"i-{tag}-{index}-{rank}" for rank in range(2)], ended)
    ledger.update_job(job_id, state=JobState.SUCCEEDED, ended_at=ended, exit_code=0)


def write(ledger: Ledger, deadline: float) -> int:
    tag = f"{os.getpid()}"
    print("ready", flush=True)
    index = 0
    while time.monotonic() < deadline:
        one_round(ledger, tag, index)
        print(f"round {index}", flush=True)
        index += 1
    return 0


def read(ledger: Ledger, deadline: float) -> int:
    reads, errors = 0, []
    while time.monotonic() < deadline:
        try:
            for job in ledger.jobs(limit=50):
                ledger.leases(job.id)
                ledger.checkpoints(job.id)
                ledger.events(job.id)
                ledger.spend(job.id)
            reads += 1
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            errors.append(f"{type(exc).__name__}: {exc}".replace("\n", " "))
    print(f"reads {reads}", flush=True)
    for error in errors:
        print(error, flush=True)
    return 1 if errors else 0


def main(argv: list[str]) -> int:
    mode, path, seconds = argv[1], argv[2], float(argv[3])
    ledger = Ledger(make_engine(path))
    deadline = time.monotonic() + seconds
    return write(ledger, deadline) if mode == "write" else read(ledger, deadline)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
