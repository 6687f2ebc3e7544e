"""`orch submit` end to end: real sshd nodes, rsync, torchrun (gloo on CPU), SQLite."""

from __future__ import annotations

import json
import re
import signal
import socket
from pathlib import Path

import pytest

from tests.support.helpers import (
    REPO,
    Background,
    assert_nothing_left,
    job_json,
    orch_env,
    run_orch,
    submitted_job_id,
)

pytestmark = pytest.mark.e2e

PRICE = "0.36"


def test_demo_job_round_trip(tmp_path: Path) -> None:
    """The README's demo on namespace nodes (the default as root). Loopback nodes run real
    DDP training in test_taken_default_port_moves_the_master_elsewhere."""
    env = orch_env(
        tmp_path / "orch", ORCH_LOCAL_PRICE_PER_HOUR=PRICE, ORCH_LOCAL_NETWORK="namespace"
    )
    result = run_orch(
        ["submit", "templates/demo-ddp.yaml", "--nodes", "2", "--gpus", "2"], env, timeout=400
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    job_id = submitted_job_id(output)
    assert "step" in output and "loss" in output  # rank 0's progress reached the screen

    job = job_json(job_id, env)
    assert job["state"] == "SUCCEEDED"
    assert len(job["leases"]) == 2 and all(lease["ended_at"] for lease in job["leases"])
    assert all(lease["price_per_hour"] == float(PRICE) for lease in job["leases"])
    assert job["spend_usd"] > 0

    # All four ranks ran in one world of four.
    logs = tmp_path / "orch" / "jobs" / job_id / "logs"
    text = (logs / "node-0.log").read_text() + (logs / "node-1.log").read_text()
    for rank in range(4):
        assert f"trainer rank={rank} world_size=4" in text, text[-3000:]
    # Without noise: the nodes name each other's addresses (c10d warns on every rank where
    # they cannot), and torchrun had no OMP_NUM_THREADS to set (the template sets none).
    assert "hostname of the client socket" not in text, text[-3000:]
    assert "Setting OMP_NUM_THREADS" not in text, text[-3000:]
    # Into a pipe: one plain line per phase, no spinner frame or carriage return.
    assert "\r" not in output and not re.search("[\u2800-\u28ff]", output), output
    phases = [line for line in output.splitlines() if line.startswith(f"orch {job_id}: ")]
    assert [line.split(": ")[1].split()[0] for line in phases] == [
        "provisioning", "syncing", "running", "stopping", "succeeded",
    ], output  # fmt: skip

    # The pulled checkpoint is complete, loads, and holds the final step.
    from orch_trainer.checkpoint import find_latest, load_state

    latest = find_latest(tmp_path / "orch" / "jobs" / job_id / "checkpoints")
    assert latest is not None
    state = load_state(latest)
    assert state["progress"]["step"] == job["step"] and job["step"] > 0
    assert job["checkpoints"] and job["checkpoints"][-1]["step"] == job["step"]

    assert_nothing_left(job)

    cost = run_orch(["cost", "--job", job_id, "--json"], env)
    assert cost.returncode == 0
    assert json.loads(cost.stdout)["total_usd"] == pytest.approx(job["spend_usd"], rel=1e-6)


def write_job(tmp_path: Path, body: str) -> Path:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(body)
    return path


FAILING_RANK = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
grads = torch.ones(4)
dist.all_reduce(grads)
if dist.get_rank() == 1:
    raise RuntimeError("boom: CUDA out of memory (simulated)")
dist.all_reduce(grads)  # rank 0 waits here for a peer that is gone
"""


def test_failing_run_command_fails_the_job_and_shows_the_tail(tmp_path: Path) -> None:
    """The reason starts with the failing rank's own error line, not torchrun's
    ChildFailedError: rank 1 (node 1) raises, and node 0's rank then fails in all_reduce on a
    closed connection; node 1 failed first, so its rank's error is the reason."""
    spec = write_job(
        tmp_path,
        "name: fails\nworkdir: work\n"
        "run: echo about to fail with a clear reason; python fail.py\n"
        "resources: {nodes: 2, gpus_per_node: 1}\nenv: {OMP_NUM_THREADS: '1'}\n",
    )
    (tmp_path / "work" / "fail.py").write_text(FAILING_RANK)
    env = orch_env(tmp_path / "orch")
    hook = f"cat > {tmp_path}/notified.json"  # the job's own end-of-job hook
    result = run_orch(["submit", str(spec), "--notify", hook], env, timeout=200)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    notified = json.loads((tmp_path / "notified.json").read_text())  # written before exit
    assert (notified["state"], notified["exit_code"]) == ("FAILED", 1)
    assert notified["reason"].startswith("rank ")
    assert "about to fail with a clear reason" in output  # the node's log tail
    assert "step None" not in output  # no step was reported: none is shown
    job = job_json(submitted_job_id(output), env)
    assert job["state"] == "FAILED"
    first = job["reason"].splitlines()[0]
    assert first == "rank 1 (node 1): RuntimeError: boom: CUDA out of memory (simulated)", job[
        "reason"
    ]
    assert "bash FAILED" in job["reason"]  # torchrun's report stays, in the tail
    assert_nothing_left(job)


def test_taken_default_port_moves_the_master_elsewhere(tmp_path: Path) -> None:
    """Two loopback nodes train the reference model in one DDP world, whose master had to
    move: loopback nodes share this host's ports, so holding 29500 here takes it from node 0."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 29500))
    holder.listen()
    try:
        spec = write_job(
            tmp_path,
            f"name: port\nworkdir: {REPO}\n"
            "run: >-\n  echo port $MASTER_PORT &&\n"
            "  python -m orch_trainer.train --model tiny --data fake --fake-size 64\n"
            "  --batch-size 16 --workers 0 --steps 2 --log-every 1 --checkpoint-seconds 0\n"
            "resources: {nodes: 2, gpus_per_node: 1}\nenv: {OMP_NUM_THREADS: '1'}\n",
        )
        env = orch_env(tmp_path / "orch", ORCH_LOCAL_NETWORK="loopback")
        result = run_orch(["submit", str(spec)], env, timeout=200)
    finally:
        holder.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    job = job_json(submitted_job_id(output), env)
    running = next(e for e in job["events"] if e["kind"] == "RUNNING")
    port = int(running["message"].rsplit(":", 1)[1])
    assert port != 29500
    assert job["state"] == "SUCCEEDED" and job["step"] == 2
    logs = tmp_path / "orch" / "jobs" / job["id"] / "logs"
    log = (logs / "node-0.log").read_text()
    assert f"port {port}" in log
    text = log + (logs / "node-1.log").read_text()
    for rank in range(2):
        assert f"trainer rank={rank} world_size=2" in text, text[-3000:]
    assert_nothing_left(job)


# `make test` keeps the foreground Ctrl-C; `orch cancel` from another terminal is
# test_controller's detached job, and this variant runs in `make soak`
@pytest.mark.parametrize("how", ["sigint", pytest.param("orch-cancel", marks=pytest.mark.soak)])
def test_cancel_while_running_shuts_everything_down(tmp_path: Path, how: str) -> None:
    spec = write_job(
        tmp_path,
        "name: cancel-me\nworkdir: work\n"
        "run: python -c \"import time; print('started', flush=True); time.sleep(600)\"\n"
        "resources: {nodes: 2, gpus_per_node: 1}\n",
    )
    env = orch_env(tmp_path / "orch")
    submit = Background(["submit", str(spec)], env)
    submit.wait_for("started")  # rank 0's output, streamed live
    job_id = submitted_job_id(submit.output)
    if how == "sigint":
        submit.proc.send_signal(signal.SIGINT)
    else:
        result = run_orch(["cancel", job_id], env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "CANCELLED" in result.stdout
    assert submit.finish() == 130, submit.output
    job = job_json(job_id, env)
    assert job["state"] == "CANCELLED"
    assert_nothing_left(job)


def test_data_env_and_ignores_reach_every_node(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "sample.txt").write_text("payload-42\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".gitignore").write_text("*.log\n")
    (work / "big.log").write_text("not synced")
    (work / "check.sh").write_text(
        'test -f "$HOME/data/sample.txt" || exit 11\n'
        "test ! -e big.log || exit 12\n"
        'echo "node=$ORCH_NODE_RANK of $ORCH_NUM_NODES ips=$ORCH_NODE_IPS '
        'master=$ORCH_MASTER_ADDR:$ORCH_MASTER_PORT ckpt=$ORCH_CHECKPOINT_DIR"\n'
        'printf "odd=%s\\n" "$ODD"\n'
        'cat "$HOME/data/sample.txt"\n'
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: data\nworkdir: work\ndata: [{src: data, dst: ~/data}]\n"
        "run: bash check.sh\n"
        'env: {ODD: "it\'s $$HOME; `x` \\"q\\""}\n'  # $$: a literal $, not the shell's
        "resources: {nodes: 2, gpus_per_node: 1}\ncheckpoint: {dir: ~/ckpt}\n"
    )
    env = orch_env(tmp_path / "orch")
    result = run_orch(["submit", str(spec)], env, timeout=200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    job = job_json(submitted_job_id(output), env)
    logs = tmp_path / "orch" / "jobs" / job["id"] / "logs"
    for node in (0, 1):
        text = (logs / f"node-{node}.log").read_text()
        assert "payload-42" in text
        assert f"node={node} of 2 ips=" in text
        assert re.search(r"ckpt=/\S*/ckpt$", text, re.MULTILINE)  # ~/ckpt, made absolute
        assert 'odd=it\'s $HOME; `x` "q"' in text
