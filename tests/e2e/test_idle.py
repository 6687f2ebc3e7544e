"""Idle shutdown: real nodes whose nvidia-smi is a stand-in replaying a trace this test writes.

The stand-in and its trace reach each node's ~/bin as a `data:` entry; the test then rewrites
the trace on the nodes' disks while the job runs.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.cluster.gpu_watch import HANG_FLOOR_S
from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import (
    assert_nothing_left,
    install_gpu_stand_in,
    job_json,
    orch_env,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

IDLE_TIMEOUT = 4
WATCH = 1
SLEEP_RUN = 'python -c "import time; time.sleep({s})"'
BUSY_RUN = (  # computes for {s} seconds (no ": " in it, which YAML would read as a mapping)
    'python -c "import time; end = time.time() + {s}; any(time.time() > end for _ in iter(int, 1))"'
)


def trace(mode: str, utils: list[float]) -> str:
    return json.dumps({"mode": mode, "gpus": [[u, 1000, 81559] for u in utils]})


def prepare(tmp_path: Path, run: str, *, gpus: list[float] | None, mode: str = "normal") -> Path:
    (tmp_path / "work").mkdir()
    node_bin = tmp_path / "node-bin"
    node_bin.mkdir()
    (node_bin / "placeholder").write_text("")
    if gpus is not None:
        install_gpu_stand_in(node_bin, trace(mode, gpus))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: idle\nworkdir: work\nrun: {run}\n"
        "data: [{src: node-bin, dst: ~/bin}]\n"
        "resources: {nodes: 2, gpus_per_node: 1}\n"
        f"budget: {{idle_timeout: {IDLE_TIMEOUT}}}\n"
    )
    return spec


def env_for(tmp_path: Path) -> dict[str, str]:
    return orch_env(tmp_path / "orch", ORCH_WATCH_INTERVAL=str(WATCH), ORCH_GPU_SAMPLE_EVERY="1")


def set_trace(tmp_path: Path, job: dict, text: str) -> None:
    """Rewrite the trace on every node's disk (atomically, as the stand-in re-reads it)."""
    for lease in job["leases"]:
        disk = tmp_path / "orch" / "local" / "nodes" / lease["instance_id"] / "disk"
        tmp = disk / "bin" / "nvidia-smi.trace.tmp"
        tmp.write_text(text)
        tmp.replace(disk / "bin" / "nvidia-smi.trace")


# `make test` keeps test_activity's busy GPU resetting the idle clock
@pytest.mark.soak
def test_one_busy_gpu_keeps_the_job_alive(tmp_path: Path) -> None:
    """Busy GPUs are never stopped, even when a node's other GPU idles."""
    spec = prepare(tmp_path, SLEEP_RUN.format(s=IDLE_TIMEOUT + 5), gpus=[0.0, 85.0])
    result = run_orch(["submit", str(spec), "--json"], env_for(tmp_path), timeout=200)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["state"] == "SUCCEEDED"


def test_gpus_going_idle_stop_the_job_after_the_timeout(tmp_path: Path) -> None:
    spec = prepare(tmp_path, SLEEP_RUN.format(s=600), gpus=[95.0])
    env = env_for(tmp_path)
    result = run_orch(["submit", str(spec), "--detach"], env, timeout=60)
    job_id = result.stdout.split()[-1]
    job = wait_for_state(job_id, env, {"RUNNING"})
    ledger = Ledger(make_engine(tmp_path / "orch" / "orch.db"))

    def busy_on_every_node() -> bool:
        samples = ledger.latest_gpu_samples(job_id)
        busy = {s.rank for s in samples if s.ok and (s.util_pct or 0) >= 95}
        return busy == {lease["rank"] for lease in job["leases"]}

    wait_until(busy_on_every_node, "busy readings from every node", 30)
    dropped = time.time()
    set_trace(tmp_path, job, trace("normal", [0.0]))
    job = wait_for_state(job_id, env, {"IDLE_STOPPED", "FAILED", "SUCCEEDED"}, timeout=120)
    assert job["state"] == "IDLE_STOPPED", job["reason"]
    stop = next(e for e in job["events"] if e["kind"] == "STOPPING")
    latency = datetime.fromisoformat(stop["at"]).timestamp() - dropped
    # The stand-in re-reads its trace every interval, so the drop shows within one interval.
    assert IDLE_TIMEOUT <= latency <= IDLE_TIMEOUT + 2 * WATCH + WATCH, latency
    assert_nothing_left(job)


# `make test` keeps test_gpu_watch's hanging nvidia-smi (unknown, then recovered) and
# test_activity's unknown readings that never count as idle
@pytest.mark.soak
def test_a_hanging_nvidia_smi_never_stops_the_job(tmp_path: Path) -> None:
    """A hang, the worst of the broken readings (garbage and failures are read as unknown the
    same way: tests/integration/test_gpu_watch.py), never counts as idle."""
    spec = prepare(tmp_path, SLEEP_RUN.format(s=600), gpus=[0.0], mode="hang")
    env = env_for(tmp_path)
    job_id = run_orch(["submit", str(spec), "--detach"], env, timeout=60).stdout.split()[-1]
    wait_for_state(job_id, env, {"RUNNING"})
    # nvidia-smi is taken for hung once silent for HANG_FLOOR_S; then, on purpose, time passes
    # beyond the idle timeout
    time.sleep(HANG_FLOOR_S + IDLE_TIMEOUT + 4 * WATCH)
    job = job_json(job_id, env)
    assert job["state"] == "RUNNING"  # unknown readings never count as idle
    assert job["gpus"] and not any(g["known"] for g in job["gpus"]), job["gpus"]
    assert "unknown" in run_orch(["status", job_id], env).stdout
    run_orch(["cancel", job_id], env, timeout=180)
    assert_nothing_left(job_json(job_id, env))


# `make test` keeps test_gpu_watch's CPU share of the job's session over SSH, test_activity's
# CPU fallback, and the guard's CPU idleness on real nodes (test_node_guard.py)
@pytest.mark.soak
@pytest.mark.parametrize(("run", "stopped"), [(SLEEP_RUN, True), (BUSY_RUN, False)])
def test_without_gpus_cpu_use_decides(tmp_path: Path, run: str, stopped: bool) -> None:
    spec = prepare(tmp_path, run.format(s=14), gpus=None)
    result = run_orch(["submit", str(spec), "--json"], env_for(tmp_path), timeout=200)
    job = json.loads(result.stdout)
    assert job["state"] == ("IDLE_STOPPED" if stopped else "SUCCEEDED"), job["reason"]
    if stopped:
        assert "no GPU" in job["reason"]
