"""The big ledger `bench.team_scale` and `bench.dashboard_pages` read: `seed_rows` makes a
reproducible mix of jobs over some months (most final, the newest few RUNNING with open leases,
GPU readings and progress history, recoveries, events and checkpoints), and `write_seed`
inserts them through the SQLModel tables in chunks."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

FINAL_MIX: tuple[tuple[str, float], ...] = (
    ("SUCCEEDED", 0.72),
    ("FAILED", 0.12),
    ("CANCELLED", 0.08),
    ("IDLE_STOPPED", 0.03),
    ("BUDGET_STOPPED", 0.03),
    ("TIMED_OUT", 0.02),
)
LIVE_JOBS = 4  # the newest jobs are RUNNING, with open leases
GPU_SAMPLE_EVERY_S = 30.0  # a running job's stored GPU readings, as `gpu_sample_every` keeps them
PROGRESS_EVERY_S = 10.0  # a running job's progress rows: one per watch check that saw a new step
SPEC_JSON = json.dumps(
    {
        "name": "train", "workdir": ".", "run": "python -m orch_trainer.train --epochs 5",
        "resources": {"gpus_per_node": 4, "accelerator": "A10G", "nodes": 2, "spot": True},
        "checkpoint": {"dir": "~/ckpt", "pull_every": 60},
        "budget": {"max_cost_usd": 20, "idle_timeout": 600, "max_runtime": 14400},
        "env": {"NCCL_DEBUG": "WARN"}, "secrets": [],
    }
)  # fmt: skip


@dataclass
class Seed:
    """Rows of a seeded ledger, as column dicts of the SQLModel tables (store.py)."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    progress_samples: list[dict[str, Any]] = field(default_factory=list)


def seed_rows(count: int, now: datetime, *, months: int = 6, seed: int = 21) -> Seed:
    """`count` jobs created over the `months` before `now` (about 30 days each), newest
    `LIVE_JOBS` RUNNING with open leases, the rest final in the proportions of `FINAL_MIX`.

    Each job has a lease per node (a spot job that recovered has a second round of leases,
    the first ended at the recovery), its state events in order (PROVISIONING ... the final
    state, with RECOVERING for a recovery), and a job that reached a step has one checkpoint
    (pruned unless it is among the newest 100). A RUNNING job has GPU readings of every node
    and GPU every `GPU_SAMPLE_EVERY_S` and a progress row every `PROGRESS_EVERY_S` over its
    run so far (its last `step` seconds), as a controller stores them. Deterministic for a
    given `seed`; times are before `now`, ends after starts."""
    rng = random.Random(seed)
    samples_rng = random.Random(seed + 1)  # its own: the jobs do not change with the samples
    out = Seed()
    span = timedelta(days=30 * months).total_seconds()
    states, weights = zip(*FINAL_MIX, strict=True)
    for n in range(count):
        age = span * (count - n) / count  # job n is older than job n + 1
        created = now - timedelta(seconds=age) - timedelta(minutes=5)
        job_id = f"seed-{n:06d}"
        live = n >= count - LIVE_JOBS
        state = "RUNNING" if live else rng.choices(states, weights)[0]
        nodes = rng.choice((1, 1, 2, 2, 4, 8))
        spot = rng.random() < 0.6
        price = Decimal(rng.choice(("1.006", "1.212", "3.912", "5.672"))) * (
            Decimal("0.35") if spot else 1
        )
        started = created + timedelta(seconds=rng.uniform(20, 180))
        run_s = rng.uniform(300, 12 * 3600) if not live else min(age, 3600.0)
        ended = None if live else min(started + timedelta(seconds=run_s), now)
        recovered = spot and not live and rng.random() < 0.1
        step = None if state in ("FAILED", "CANCELLED") and rng.random() < 0.5 else int(run_s)
        out.jobs.append(
            {
                "id": job_id, "name": rng.choice(("cifar-ddp", "llm-sft", "resnet", "sweep")),
                "state": state, "provider": rng.choice(("aws", "aws", "local")),
                "nodes": nodes, "gpus_per_node": rng.choice((1, 4, 8)), "spec_json": SPEC_JSON,
                "spec_path": "job.yaml", "created_at": created, "started_at": started,
                "ended_at": ended, "step": step, "loss": None if step is None else 0.25,
                "exit_code": None if live else _exit_code(state), "reason": None,
                "recoveries": int(recovered), "switches": 0, "owner": f"user{n % 7}",
                "controller": None, "stop_state": None, "identity": None, "cluster_id": None,
                "policy_state": None,
            }
        )  # fmt: skip
        rounds = [(created + timedelta(seconds=10), ended)]
        if recovered:
            assert ended is not None
            middle = started + (ended - started) / 2
            rounds = [(created + timedelta(seconds=10), middle), (middle, ended)]
        for number, (launched, lease_end) in enumerate(rounds):
            for rank in range(nodes):
                out.leases.append(
                    {
                        "job_id": job_id, "cluster": job_id, "provider": out.jobs[-1]["provider"],
                        "instance_id": f"i-{n:06d}{number}{rank:02d}", "rank": rank,
                        "market": "spot" if spot else "on-demand", "instance_type": "g5.12xlarge",
                        "price_per_hour": price, "launched_at": launched, "ended_at": lease_end,
                        "identity": None,
                    }
                )  # fmt: skip
        kinds = ["PROVISIONING", "SYNCING", "RUNNING"]
        if recovered:
            kinds += ["RECOVERING", "PROVISIONING", "SYNCING", "RUNNING"]
        if not live:
            kinds += ["STOPPING", state]
        for index, kind in enumerate(kinds):
            at = started if index == 0 else started + timedelta(seconds=run_s * index / len(kinds))
            out.events.append(
                {"job_id": job_id, "at": min(at, now), "kind": kind, "message": "", "step": None}
            )
        if step is not None:
            pulled = min(started + timedelta(seconds=run_s), now)
            out.checkpoints.append(
                {
                    "job_id": job_id, "name": f"step-{step:06d}", "step": step,
                    "size_bytes": 512 << 20, "pulled_at": pulled,
                    "kind": "step", "digest": None, "in_mirror": n >= count - 100,
                    "stored_at": None, "store_url": None, "files_json": None,
                    "pruned_at": None if n >= count - 100 else ended,
                }
            )  # fmt: skip
        if live:
            since = max(started, now - timedelta(seconds=run_s))
            _live_samples(out, out.jobs[-1], since, now, samples_rng)
    return out


def _live_samples(
    out: Seed, job: dict[str, Any], started: datetime, now: datetime, rng: random.Random
) -> None:
    """GPU readings (utilization, memory) and progress rows of a running `job` from `started`
    (when its step count began) to `now`."""
    run_s = (now - started).total_seconds()
    total = 24576.0 if job["gpus_per_node"] == 8 else 23028.0
    for k in range(int(run_s // GPU_SAMPLE_EVERY_S)):
        at = started + timedelta(seconds=(k + 1) * GPU_SAMPLE_EVERY_S)
        for rank in range(job["nodes"]):
            for gpu in range(job["gpus_per_node"]):
                out.gpu_samples.append(
                    {
                        "job_id": job["id"], "rank": rank, "gpu": gpu, "at": at,
                        "util_pct": round(rng.uniform(70, 99), 1),
                        "mem_used_mib": round(rng.uniform(0.6, 0.9) * total),
                        "mem_total_mib": total, "ok": True,
                    }
                )  # fmt: skip
    checks = int(run_s // PROGRESS_EVERY_S)
    for k in range(checks):
        out.progress_samples.append(
            {
                "job_id": job["id"], "at": started + timedelta(seconds=(k + 1) * PROGRESS_EVERY_S),
                "step": max(k + 1, (job["step"] or 0) * (k + 1) // checks),
                "epoch": round(5 * (k + 1) / checks, 3), "loss": round(2.3 / (1 + k / 40), 4),
                "lr": 0.1, "img_s": round(rng.uniform(900, 1100), 1),
            }
        )  # fmt: skip


def _exit_code(state: str) -> int:
    return {"SUCCEEDED": 0, "BUDGET_STOPPED": 4, "CANCELLED": 130}.get(state, 1)


def write_seed(engine: Any, rows: Seed, chunk: int = 5000) -> None:
    """Insert `rows` through the SQLModel tables, in one transaction, in executemany chunks."""
    from orchestrator.ledger.store import (
        CheckpointRecord,
        Event,
        GpuSampleRecord,
        Job,
        Lease,
        ProgressSampleRecord,
    )

    with engine.begin() as connection:
        for model, items in (
            (Job, rows.jobs),
            (Lease, rows.leases),
            (Event, rows.events),
            (CheckpointRecord, rows.checkpoints),
            (GpuSampleRecord, rows.gpu_samples),
            (ProgressSampleRecord, rows.progress_samples),
        ):
            table = model.__table__  # type: ignore[attr-defined]
            for start in range(0, len(items), chunk):
                connection.execute(table.insert(), items[start : start + chunk])
