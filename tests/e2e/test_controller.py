"""The controller: detached jobs, adoption after kill -9, budget and runtime caps, a busy ledger.

Real sshd nodes and real torchrun; short intervals (ORCH_WATCH_INTERVAL and friends) keep the
tests quick while exercising the same code paths as the defaults.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest

from tests.support.helpers import (
    assert_nothing_left,
    counter_run,
    counter_workdir,
    fast_env,
    job_json,
    orch_env,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

TICKS = (
    "python -c \"import time; [print('tick', i, flush=True) or time.sleep(1) for i in range({n})]\""
)


def write_job(tmp_path: Path, body: str) -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text("workdir: work\nresources: {nodes: 2, gpus_per_node: 1}\n" + body)
    return path


def detach(spec: Path, env: dict[str, str]) -> str:
    result = run_orch(["submit", str(spec), "--detach"], env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.strip().splitlines()[-1]  # the id alone on the last line
    assert " " not in job_id and job_id.startswith(spec.read_text().split("name: ")[1][:4])
    return job_id


def test_detached_job_is_watched_from_other_commands_and_cancelled(tmp_path: Path) -> None:
    spec = write_job(tmp_path, f"name: detached\nrun: {TICKS.format(n=600)}\n")
    notified = tmp_path / "notified.json"  # the configuration's end-of-job hook
    hook = f'echo "$ORCH_JOB_STATE $ORCH_EXIT_CODE" > {tmp_path}/state; cat > {notified}.tmp; '
    env = fast_env(tmp_path / "orch", ORCH_NOTIFY=hook + f"mv {notified}.tmp {notified}")
    job_id = detach(spec, env)
    wait_for_state(job_id, env, {"RUNNING"})
    wait_until(lambda: "tick 2" in run_orch(["logs", job_id], env).stdout, "tick 2", 60,
               interval=0.5)  # fmt: skip
    node1 = run_orch(["logs", job_id, "--rank", "1"], env).stdout  # rank 1 lives on node 1
    assert "tick 0" in node1
    status = run_orch(["status", job_id], env)
    assert status.returncode == 0 and "RUNNING" in status.stdout

    cancelled = run_orch(["cancel", job_id], env, timeout=180)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    job = job_json(job_id, env)
    assert job["state"] == "CANCELLED" and job["exit_code"] == 130
    assert_nothing_left(job)
    assert not (tmp_path / "orch" / "jobs" / job_id / "controller.pid").exists()
    # The detached controller ran the hook after teardown, the job's document on its stdin.
    wait_until(notified.exists, "the notify hook's file", 20)
    document = json.loads(notified.read_text())
    assert (document["id"], document["state"], document["exit_code"]) == (job_id, "CANCELLED", 130)
    assert (tmp_path / "state").read_text() == "CANCELLED 130\n"
    assert any(e["kind"] == "NOTIFIED" for e in job_json(job_id, env)["events"])


# `make test` keeps test_crash_trials' kills (a new controller adopts and finishes the job) and
# test_runner's adoption; this plain kill runs in `make soak`
@pytest.mark.soak
def test_a_killed_controller_is_replaced_and_the_job_finishes(tmp_path: Path) -> None:
    spec = write_job(tmp_path, f"name: adopted\nrun: {TICKS.format(n=15)}\n")
    env = fast_env(tmp_path / "orch")
    job_id = detach(spec, env)
    wait_for_state(job_id, env, {"RUNNING"})
    wait_until(lambda: "tick 2" in run_orch(["logs", job_id], env).stdout, "tick 2", 60,
               interval=0.5)  # fmt: skip
    pid_file = tmp_path / "orch" / "jobs" / job_id / "controller.pid"
    old_pid = int(pid_file.read_text())
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{old_pid}").exists(), "the controller's end", 10)

    status = run_orch(["status", job_id, "--json"], env)  # any command revives the controller
    assert "a new one adopted the job" in status.stderr
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    kinds = [e["kind"] for e in job["events"]]
    assert "ADOPTED" in kinds and kinds.count("RUNNING") == 1  # training was never restarted
    log = run_orch(["logs", job_id], env).stdout
    assert [line for line in log.splitlines() if line.startswith("tick")] == [
        f"tick {i}" for i in range(15)
    ]  # nothing lost or repeated across the change of controller
    assert_nothing_left(job)


def test_budget_cap_stops_before_the_cap_with_a_checkpoint(tmp_path: Path) -> None:
    cap = Decimal("0.08")
    price = Decimal("3")  # per node: 2 nodes reach the cap in 48 s
    # The step counter starts at once (the reference trainer's torch import can outlast the
    # budget on a loaded machine) and checkpoints only when stopped: the checkpoint kept is the
    # emergency one the budget stop asked for.
    counter_workdir(tmp_path)
    spec = write_job(
        tmp_path,
        "name: capped\n"
        f"run: {counter_run(4000, checkpoint_every=100000)}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 5}\n"
        f"budget: {{max_cost_usd: {cap}}}\n",
    )
    # The stop waits for the emergency checkpoint (SIGTERM, finish the step, save, exit) and
    # pulls it: on two busy cores that can take longer than the default allowance of 15 s.
    env = fast_env(
        tmp_path / "orch", ORCH_LOCAL_PRICE_PER_HOUR=str(price), ORCH_STOP_ALLOWANCE="25"
    )
    result = run_orch(["submit", str(spec), "--json"], env, timeout=300)
    assert result.returncode == 4, result.stdout + result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "BUDGET_STOPPED"
    one_tick = price * 2 * Decimal(2) / Decimal(3600)  # the cost of one budget interval
    assert Decimal(str(job["spend_usd"])) <= cap + one_tick
    assert job["checkpoints"], "the emergency checkpoint was not pulled"
    assert_nothing_left(job)


def test_max_runtime_times_the_job_out(tmp_path: Path) -> None:
    spec = write_job(
        tmp_path, f"name: slow\nrun: {TICKS.format(n=600)}\nbudget: {{max_runtime: 6s}}\n"
    )
    env = fast_env(tmp_path / "orch")
    started = time.monotonic()
    result = run_orch(["submit", str(spec), "--json"], env, timeout=200)
    assert result.returncode == 1, result.stdout + result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "TIMED_OUT" and "max_runtime" in job["reason"]
    assert time.monotonic() - started < 90
    assert_nothing_left(job)


def test_plan_above_max_hourly_is_refused_before_launch(tmp_path: Path) -> None:
    spec = write_job(tmp_path, "name: pricey\nrun: echo hi\nbudget: {max_hourly_usd: 1}\n")
    env = orch_env(tmp_path / "orch", ORCH_LOCAL_PRICE_PER_HOUR="0.75")
    result = run_orch(["submit", str(spec)], env)
    assert result.returncode == 2
    assert "max_hourly_usd" in result.stderr and "$1.50/h" in result.stderr


@pytest.mark.soak  # `make test` keeps tests/integration/test_ledger_crash.py's readers
def test_status_in_a_loop_while_a_job_runs_never_hits_a_locked_database(tmp_path: Path) -> None:
    spec = write_job(tmp_path, f"name: busy\nrun: {TICKS.format(n=600)}\n")
    env = fast_env(tmp_path / "orch")
    job_id = detach(spec, env)
    wait_for_state(job_id, env, {"RUNNING"})
    failures: list[str] = []

    def hammer() -> None:
        for _ in range(8):
            result = run_orch(["status", job_id, "--json"], env, timeout=60)
            if result.returncode != 0 or "locked" in result.stderr:
                failures.append(result.stderr)
            else:
                json.loads(result.stdout)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run_orch(["cancel", job_id], env, timeout=180)
    assert failures == []
    assert_nothing_left(job_json(job_id, env))


def test_reconcile_ends_nodes_no_job_owns(tmp_path: Path) -> None:
    from orchestrator.config import LocalSettings, Settings
    from orchestrator.ledger.store import Ledger, make_engine
    from orchestrator.providers.base import LaunchRequest
    from orchestrator.providers.local.provider import LocalProvider
    from orchestrator.remote.keys import ensure_identity

    home = tmp_path / "orch"
    provider = LocalProvider(Settings(home=home, local=LocalSettings()))
    key = ensure_identity(home / "keys" / "ghost", "ghost").public_key
    ledger_id = Ledger(make_engine(home / "orch.db")).ledger_id  # the ledger the CLI opens
    ghosts = provider.launch(
        LaunchRequest(
            job_id="ghost", cluster="ghost", count=2, gpus_per_node=1, public_key=key,
            ledger_id=ledger_id,
        )
    )  # fmt: skip
    env = orch_env(home)
    result = run_orch(["reconcile", "--json"], env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["terminated"] == {
        "ghost": sorted(g.instance_id for g in ghosts)
    }
    assert provider.list_owned() == []
    assert_nothing_left(
        {"leases": [{"instance_id": g.instance_id, "ended_at": "n/a"} for g in ghosts]}
    )
    again = run_orch(["reconcile"], env)
    assert "nothing to reconcile" in again.stdout


def test_down_ends_a_running_cluster_at_once(tmp_path: Path) -> None:
    spec = write_job(tmp_path, f"name: downed\nrun: {TICKS.format(n=600)}\n")
    env = fast_env(tmp_path / "orch")
    job_id = detach(spec, env)
    wait_for_state(job_id, env, {"RUNNING"})
    result = run_orch(["down", job_id], env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "terminated 2 local node(s)" in result.stdout
    job = wait_for_state(job_id, env, {"FAILED", "CANCELLED"}, timeout=120)
    assert_nothing_left(job)
    assert run_orch(["down", "no-such-cluster"], env).returncode == 2
