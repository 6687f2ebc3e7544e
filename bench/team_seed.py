"""The big ledger `bench.team_scale` reads: `seed_rows` makes a reproducible mix of jobs over
some months (most final, the newest few RUNNING with open leases, recoveries, events and
checkpoints), and `write_seed` inserts them through the SQLModel tables in chunks."""

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


def seed_rows(count: int, now: datetime, *, months: int = 6, seed: int = 21) -> Seed:
    """`count` jobs created over the `months` before `now` (about 30 days each), newest
    `LIVE_JOBS` RUNNING with open leases, the rest final in the proportions of `FINAL_MIX`.

    Each job has a lease per node (a spot job that recovered has a second round of leases,
    the first ended at the recovery), its state events in order (PROVISIONING ... the final
    state, with RECOVERING for a recovery), and a job that reached a step has one checkpoint
    (pruned unless it is among the newest 100). Deterministic for a given `seed`; times are
    before `now`, ends after starts."""
    rng = random.Random(seed)
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
    return out


def _exit_code(state: str) -> int:
    return {"SUCCEEDED": 0, "BUDGET_STOPPED": 4, "CANCELLED": 130}.get(state, 1)


def write_seed(engine: Any, rows: Seed, chunk: int = 5000) -> None:
    """Insert `rows` through the SQLModel tables, in one transaction, in executemany chunks."""
    from orchestrator.ledger.store import CheckpointRecord, Event, Job, Lease

    with engine.begin() as connection:
        for model, items in (
            (Job, rows.jobs),
            (Lease, rows.leases),
            (Event, rows.events),
            (CheckpointRecord, rows.checkpoints),
        ):
            table = model.__table__  # type: ignore[attr-defined]
            for start in range(0, len(items), chunk):
                connection.execute(table.insert(), items[start : start + chunk])
