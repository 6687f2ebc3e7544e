"""Jobs on machines the user already has: an SSH fleet of two real sshd machines that the test
starts as a user's own (`tests/support/fleet_hosts.py`: own address, own login home, the
user's key, two GPUs each through the nvidia-smi stand-in).

One fleet serves the whole story, as a lab's machines serve one job after another:
- two 1-GPU jobs share the first machine, each seeing its own GPU, while a 2-GPU job holds
  the second; a further 2-GPU job waits in the fleet's queue (WAITING, its position in
  `orch status`; `--no-wait` refuses instead) and starts within seconds of the cancel that
  frees the first machine; the others end at their idle timeout and their budget cap;
- a 2-node DDP job runs across both machines (torchrun, master on the first);
- a 1-node job whose machine dies mid-run is placed again on the other machine's free GPUs
  and resumes from its checkpoint;
- after every job (succeeded, cancelled, idle, capped, recovered), the machines' sshd still
  answer and no allocation is left: no folder, no key line but the user's own.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.support.fleet_hosts import FleetMachine, fleet_machines
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    detach,
    fast_env,
    job_json,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

GPU_ENV_RUN = (
    'echo "visible=$CUDA_VISIBLE_DEVICES home=$HOME"; echo $$ > "$HOME/pid"; sleep {seconds}'
)


def _spec(
    path: Path, name: str, run: str, *, nodes: int = 1, gpus: int = 2, extra: str = ""
) -> Path:
    spec = path / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nworkdir: work\nprovider: ssh\nfleet: lab\nlauncher: none\n"
        f"resources: {{nodes: {nodes}, gpus_per_node: {gpus}}}\n"
        f"run: {json.dumps(run)}\n{extra}"
    )
    return spec


def _nothing_left(machines: list[FleetMachine]) -> None:
    """Each machine's sshd answers, no allocation folder or key line remains, the user's own
    key line is there as it was."""
    for machine in machines:
        assert machine.sshd_alive(), f"{machine.name}: its sshd is gone"
        fleet_dir = machine.home / ".orch-fleet"
        left = sorted(p.name for p in fleet_dir.glob("s-*"))
        assert left == [], f"{machine.name}: allocations left: {left}"
        keys = (machine.home / ".ssh" / "authorized_keys").read_text()
        assert "orch-allocation:" not in keys, keys


def test_a_fleet_runs_queues_spans_and_recovers_without_powering_anything_off(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    env = fast_env(home)
    counter_workdir(tmp_path)
    with fleet_machines(tmp_path, gpus=(2, 2)) as machines:
        added = run_orch(
            ["fleet", "add", "lab", *(a for m in machines for a in ("--host", m.login)),
             "--identity", str(machines[0].key), "--price-per-hour", "20"],
            env, timeout=120,
        )  # fmt: skip
        assert added.returncode == 0, added.stdout + added.stderr

        # Two 1-GPU jobs share the first machine, each with a GPU of its own; a 2-GPU job
        # fills the second; another 2-GPU job waits in the fleet's queue until the first
        # machine is free again.
        first = detach(_spec(tmp_path, "first", GPU_ENV_RUN.format(seconds=300), gpus=1),
                       env, "--yes")  # fmt: skip
        second = detach(
            _spec(tmp_path, "second", GPU_ENV_RUN.format(seconds=300), gpus=1,
                  extra="budget: {idle_timeout: 6}\n"),
            env, "--yes",
        )  # fmt: skip
        big = detach(
            _spec(tmp_path, "big", GPU_ENV_RUN.format(seconds=300),
                  # 162 s on the second machine: past the queue's checks below, which take
                  # a minute and more on a loaded machine (its end would free room for third)
                  extra="budget: {max_cost_usd: 0.9}\n"),
            env, "--yes",
        )  # fmt: skip
        for job_id in (first, big):
            wait_for_state(job_id, env, {"RUNNING"}, timeout=120)
        third = detach(_spec(tmp_path, "third", GPU_ENV_RUN.format(seconds=2)), env, "--yes")
        wait_for_state(third, env, {"WAITING"}, timeout=60)
        fifth = detach(_spec(tmp_path, "fifth", "true"), env, "--yes")
        wait_for_state(fifth, env, {"WAITING"}, timeout=60)
        listed = json.loads(run_orch(["status", "--json"], env).stdout)
        queue = {j["id"]: j.get("queue") for j in listed["jobs"]}
        assert queue[third] == {"fleet": "lab", "position": 1, "of": 2}, queue
        assert queue[fifth] == {"fleet": "lab", "position": 2, "of": 2}, queue
        assert "WAITING (2 of 2 on lab)" in run_orch(["status"], env).stdout
        assert run_orch(["cancel", fifth], env, timeout=120).returncode == 0
        assert wait_for_state(fifth, env, {"CANCELLED"}, timeout=60)["leases"] == []
        listed = json.loads(run_orch(["status", "--json"], env).stdout)
        queue = {j["id"]: j.get("queue") for j in listed["jobs"]}
        assert queue[third] == {"fleet": "lab", "position": 1, "of": 1} and not queue[fifth]
        fourth = _spec(tmp_path, "fourth", "true")
        refused = run_orch(["submit", str(fourth), "--no-wait", "--yes"], env, timeout=60)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "no room" in refused.stderr, refused.stderr

        assert wait_for_state(second, env, {"IDLE_STOPPED"}, timeout=120)
        assert job_json(third, env)["state"] == "WAITING"  # one GPU of the first machine held
        cancelled_at = time.monotonic()
        assert run_orch(["cancel", first], env, timeout=120).returncode == 0
        wait_for_state(third, env, {"RUNNING", "SUCCEEDED"}, timeout=60)
        # Soon, not fast: two CLI calls of a loaded machine are in it (the start's own speed
        # is bench/fleet_start.py's)
        started_after = time.monotonic() - cancelled_at
        assert started_after < 60, f"the queued job started {started_after:.1f} s after the cancel"
        assert wait_for_state(third, env, {"SUCCEEDED"}, timeout=120)["exit_code"] == 0
        assert wait_for_state(big, env, {"BUDGET_STOPPED"}, timeout=240)
        seen = {}
        for job_id in (first, second, big, third):
            logs = run_orch(["logs", job_id], env).stdout
            (visible,) = re.findall(r"visible=(\S*)", logs)
            seen[job_id] = visible
            assert re.search(r"home=\S+/\.orch-fleet/s-[0-9a-f]{12}", logs), logs
        assert sorted([seen[first], seen[second]]) == ["0", "1"], seen
        assert seen[big] == seen[third] == "0,1", seen
        _nothing_left(machines)

        # A 2-node DDP run across both machines.
        ddp = tmp_path / "ddp.yaml"
        ddp.write_text(
            "name: ddp\nworkdir: work\nprovider: ssh\nfleet: lab\n"
            "resources: {nodes: 2, gpus_per_node: 1}\n"
            f"run: {counter_run(4, step_s=0.2)}\n"
        )
        ran = run_orch(["submit", str(ddp), "--yes"], env, timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        _nothing_left(machines)

        # A machine dies under a 1-node job: it goes on on the other one, from its checkpoint.
        lost = tmp_path / "lost.yaml"
        lost.write_text(
            "name: lost\nworkdir: work\nprovider: ssh\nfleet: lab\n"
            "resources: {nodes: 1, gpus_per_node: 1}\n"
            f"run: {counter_run(40, step_s=0.5, checkpoint_every=2)}\n"
        )
        job_id = detach(lost, env, "--yes")

        def far_enough() -> dict | None:
            job = job_json(job_id, env)
            return job if (job["step"] or 0) >= 4 and job["checkpoints"] else None

        job = wait_until(far_enough, "the job trains and checkpoints", 180, interval=0.5)
        (lease,) = [le for le in job["leases"] if le["ended_at"] is None]
        dying = next(
            m for m in machines if (m.home / ".orch-fleet" / lease["instance_id"]).exists()
        )
        dying.kill()
        done = wait_for_state(job_id, env, {"SUCCEEDED"}, timeout=300)
        assert done["recoveries"] >= 1, done
        logs = run_orch(["logs", job_id], env).stdout
        resumed = re.findall(r'"event": "resume", "step": (\d+)', logs)
        assert resumed and int(resumed[-1]) >= 2, (logs[-3000:], done["events"])
        survivor = next(m for m in machines if m is not dying)
        _nothing_left([survivor])
        status = json.loads(run_orch(["fleet", "status", "lab", "--json"], env).stdout)
        assert status, status
