"""Spot interruptions on real local nodes with real torchrun: notice, reclaim, recovery.

Nodes are reclaimed with `orch local preempt` (a notice on the node's metadata endpoint, then
link down and every process killed at once), and the job must finish its target step count
without losing work beyond what the acceptance allows. The notice test runs the reference
trainer; tests about what orch does around a reclaim run the step counter (same contract,
without torch's seconds of import in every rank).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    assert_spend_is_leases,
    counter_run,
    counter_workdir,
    detach,
    events,
    fast_env,
    job_json,
    preempt,
    run_orch,
    utc_time,
    wait_for,
    wait_for_state,
)
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.e2e

CHECKPOINT_EVERY = 6
FAKE_SIZE = 3072  # 2 nodes x 2 ranks x batch 32: 24 steps per epoch
EPOCHS = 2
TARGET_STEPS = FAKE_SIZE // (2 * 2 * 32) * EPOCHS
STEP_S = 0.25  # the step counter's pace: TARGET_STEPS take 12 s


def trainer_job(tmp_path: Path, *, name: str = "spot", extra: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: {name}\n"
        f"workdir: {REPO}\n"
        "run: >-\n"
        f"  python -m orch_trainer.train --model tiny --data fake --fake-size {FAKE_SIZE}\n"
        f"  --epochs {EPOCHS} --batch-size 32 --workers 0 --checkpoint-every {CHECKPOINT_EVERY}\n"
        "  --log-every 2\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 2}\n"
        "env: {OMP_NUM_THREADS: '1'}\n" + extra
    )
    return path


def counter_job(tmp_path: Path, *, name: str, extra: str = "", steps: int = TARGET_STEPS) -> Path:
    """The same shape and checkpoint cadence as `trainer_job`, running the step counter."""
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: {name}\n"
        f"workdir: {counter_workdir(tmp_path)}\n"
        f"run: {counter_run(steps, step_s=STEP_S, checkpoint_every=CHECKPOINT_EVERY)}\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 1}\n" + extra
    )
    return path


def spot_env(home: Path, **extra: str) -> dict[str, str]:
    return fast_env(home, ORCH_LOCAL_PRICE_PER_HOUR="0.90", **extra)


# `make test` keeps the same notice on node 1 with the same trainer in a container
# (test_container_job.py, every assertion of this one) and the notice on the AWS sandbox's
# bare hosts (test_sandbox_spot.py)
@pytest.mark.soak
def test_notice_on_node_1_resumes_from_the_emergency_checkpoint(tmp_path: Path) -> None:
    env = spot_env(tmp_path / "orch")
    job_id = detach(trainer_job(tmp_path), env)
    before = wait_for(job_id, env, lambda j: (j["step"] or 0) >= 8, "step 8")
    step_at_notice = before["step"]
    preempt(job_id, env, node=1, notice=10)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=240)
    assert job["state"] == "SUCCEEDED", job
    assert job["step"] == TARGET_STEPS
    assert job["recoveries"] == 1
    # Node 1 alone was replaced: node 0 ran through (one lease), its boot not paid again.
    assert len(job["leases"]) == 3 and all(lease["market"] == "spot" for lease in job["leases"])
    assert sorted(lease["rank"] for lease in job["leases"]) == [0, 1, 1]
    assert_spend_is_leases(job)
    (preempted,) = events(job, "PREEMPTED")
    assert preempted["message"].startswith("notice: node 1")
    # The replacement was launched at the notice, before the emergency checkpoint was pulled.
    kinds = [event["kind"] for event in job["events"]]
    replacement = kinds.index("LAUNCHED", kinds.index("PREEMPTED"))
    assert replacement < kinds.index("SALVAGED") < kinds.index("RECOVERING"), kinds
    (resumed,) = events(job, "RESUMED")
    # No work lost: the emergency checkpoint was written at or after the step of the notice.
    assert resumed["step"] is not None and resumed["step"] >= step_at_notice, job["events"]
    assert_nothing_left(job)
    log = (tmp_path / "orch" / "jobs" / job_id / "logs" / "node-0.log").read_text()
    assert '"event": "resume"' in log or '"event":"resume"' in log, log[-2000:]


# `make test` keeps test_checkpoints.py's job that loses node 0 without notice and resumes
# from its pulled snapshot
@pytest.mark.soak
def test_master_killed_without_notice_resumes_from_the_last_good_pulled_checkpoint(
    tmp_path: Path,
) -> None:
    """Node 0 dies without notice: the job resumes from the last pulled checkpoint (at most
    one checkpoint interval lost), never from the half-written one planted on node 0."""
    home = tmp_path / "orch"
    env = spot_env(home)
    job_id = detach(counter_job(tmp_path, name="master"), env)
    before = wait_for(
        job_id, env, lambda j: any((c["step"] or 0) >= 12 for c in j["checkpoints"]), "a pull"
    )
    node0 = next(lease for lease in before["leases"] if lease["rank"] == 0)
    ckpt = home / "local" / "nodes" / node0["instance_id"] / "disk" / "ckpt"
    bogus = ckpt / "step-009999"
    bogus.mkdir()
    (bogus / "state.json").write_text('{"step": 99')  # half written: no COMPLETE marker
    (ckpt / "latest").write_text("step-009999\n")
    time.sleep(3)  # at least one pull interval sees the half-written directory
    pulled = max(c["step"] for c in job_json(job_id, env)["checkpoints"] if c["step"])
    reclaimed_at = utc_time(preempt(job_id, env, node=0, notice=0)["reclaimed_at"])
    after_kill = job_json(job_id, env)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=240)
    assert job["state"] == "SUCCEEDED", job
    assert job["step"] == TARGET_STEPS and job["recoveries"] == 1
    (preempted,) = events(job, "PREEMPTED")
    assert "node 0" in preempted["message"] and preempted["message"].startswith("preempted")
    # Acted on at the first missed check (5 s probe timeout), not when the connection's
    # keepalive gives up on the dead node (15 s).
    detection_s = (utc_time(preempted["at"]) - reclaimed_at).total_seconds()
    assert detection_s < 12, detection_s
    (resumed,) = events(job, "RESUMED")
    assert pulled <= resumed["step"] < 9999 and "step-009999" not in resumed["message"]
    lost = (after_kill["step"] or 0) - resumed["step"]
    assert lost <= CHECKPOINT_EVERY + 4, (after_kill["step"], resumed["step"])  # + one log gap
    assert all(c["name"] != "step-009999" for c in job["checkpoints"])
    assert not (home / "jobs" / job_id / "checkpoints" / "step-009999" / "COMPLETE").exists()
    # node 1 stayed (recovery.replace: lost); only node 0 was launched again
    assert sorted(lease["rank"] for lease in job["leases"]) == [0, 0, 1]
    assert_spend_is_leases(job)
    assert_nothing_left(job)


# `make test` keeps test_runner's node taken during the sync (no nodes) and test_network_faults'
# lost node without recoveries left
@pytest.mark.soak
def test_preemption_while_syncing_and_too_many_preemptions(tmp_path: Path) -> None:
    """A node taken during the sync is replaced; beyond max_recoveries the job FAILS."""
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "blob.bin", "wb") as blob:  # sparse: instant here, slow to send
        blob.truncate(768 * 1024 * 1024)
    home = tmp_path / "orch"
    env = spot_env(home)
    spec = counter_job(
        tmp_path,
        name="fragile",
        extra=f"data: [{{src: {data}, dst: ~/data}}]\nrecovery: {{max_recoveries: 1}}\n",
    )
    job_id = detach(spec, env)
    ledger = Ledger(make_engine(home / "orch.db"))
    wait_for_job(ledger, job_id, lambda job: job.state == "SYNCING", "SYNCING", 60, interval=0.05)
    first = ledger.leases(job_id)
    provider = LocalProvider(load_settings(env))
    assert provider.reclaim(next(lease.instance_id for lease in first if lease.rank == 1))
    wait_for(job_id, env, lambda j: j["recoveries"] == 1 and j["state"] == "RUNNING", "recovery")
    job = job_json(job_id, env)
    ended = {lease["instance_id"]: lease["ended_at"] for lease in job["leases"]}
    taken = next(lease.instance_id for lease in first if lease.rank == 1)
    stayed = next(lease.instance_id for lease in first if lease.rank == 0)
    assert len(first) == 2 and ended[taken] and ended[stayed] is None  # node 0 stayed
    preempted = events(job, "PREEMPTED")
    assert len(preempted) == 1 and "while the job started" in preempted[0]["message"], preempted
    # The second reclaim is one more than recovery.max_recoveries allows.
    preempt(job_id, env, node=1, notice=0)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=120)
    assert job["state"] == "FAILED", job
    assert "no recovery left (recovery.max_recoveries is 1, 1 used)" in job["reason"]
    assert job["exit_code"] == 1 and len(job["leases"]) == 3
    assert_nothing_left(job)


@pytest.mark.soak
def test_soak_seeded_random_reclaims(tmp_path: Path) -> None:
    """Five seeded random reclaims during one run (`make soak`): the job still ends at its
    target step count. `make test` keeps the single reclaims above."""
    reclaims, size = 5, 3
    env = spot_env(tmp_path / "orch")
    spec = counter_job(
        tmp_path, name="soak", extra="recovery: {max_recoveries: 8}\n", steps=size * TARGET_STEPS
    )
    job_id = detach(spec, env)
    chaos = run_orch_background(
        ["local", "chaos", job_id, "--seed", "7", "--rate", "15", "--count", str(reclaims)], env
    )
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=900)
    chaos.join(30)
    assert job["state"] == "SUCCEEDED", job
    assert job["step"] == size * TARGET_STEPS
    assert job["recoveries"] >= reclaims, (chaos.output, job["events"])
    assert len(events(job, "PREEMPTED")) == job["recoveries"]
    assert_spend_is_leases(job)
    assert_nothing_left(job)


class OrchThread(threading.Thread):
    """An orch command run in a thread; its output is kept for failure messages."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.args, self.env, self.output = args, env, ""

    def run(self) -> None:
        result = run_orch(self.args, self.env, timeout=600)
        self.output = f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def run_orch_background(args: list[str], env: dict[str, str]) -> OrchThread:
    thread = OrchThread(args, env)
    thread.start()
    return thread


def quick_job(tmp_path: Path, spot: str) -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    path = tmp_path / f"job-{spot}.yaml"
    path.write_text(
        f"name: capacity\nworkdir: work\nrun: python -c \"print('trained')\"\n"
        f"resources: {{nodes: 2, gpus_per_node: 1, spot: {spot}}}\n"
    )
    return path


def test_spot_auto_falls_back_to_on_demand_when_spot_is_refused(tmp_path: Path) -> None:
    env = spot_env(tmp_path / "orch")
    assert run_orch(["local", "spot", "off"], env).returncode == 0
    result = run_orch(["submit", str(quick_job(tmp_path, "auto")), "--json"], env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "SUCCEEDED"
    assert [lease["market"] for lease in job["leases"]] == ["on-demand", "on-demand"]
    assert all(lease["price_per_hour"] == 0.9 for lease in job["leases"])


def test_spot_only_retries_with_backoff_then_fails_with_the_reason(tmp_path: Path) -> None:
    env = spot_env(tmp_path / "orch", ORCH_LAUNCH_RETRIES="2", ORCH_LAUNCH_BACKOFF="0.2")
    assert run_orch(["local", "spot", "off"], env).returncode == 0
    result = run_orch(["submit", str(quick_job(tmp_path, "true")), "--json"], env, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "FAILED" and job["leases"] == []
    assert "spot capacity was refused 3 time(s) in a row" in job["reason"]
    assert len(events(job, "WAITING")) == 2


def test_spot_only_launches_once_capacity_returns(tmp_path: Path) -> None:
    # Tries 2, 6, 14, 30, 62 and 126 s after the first: one still comes after the two orch commands
    # below, however slow
    env = spot_env(tmp_path / "orch", ORCH_LAUNCH_RETRIES="6", ORCH_LAUNCH_BACKOFF="2")
    assert run_orch(["local", "spot", "off"], env).returncode == 0
    job_id = detach(quick_job(tmp_path, "true"), env)
    wait_for(job_id, env, lambda j: events(j, "WAITING"), "a refused launch", timeout=60)
    assert run_orch(["local", "spot", "on"], env).returncode == 0
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job
    assert [lease["market"] for lease in job["leases"]] == ["spot", "spot"]
