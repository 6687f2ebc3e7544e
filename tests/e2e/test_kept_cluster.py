"""A kept cluster on real namespace nodes (`orch submit --cluster NAME`): the second and third
jobs run on the first job's nodes (same instances, nothing launched, setup skipped while
unchanged, the same torchrun environment), a job submitted meanwhile queues (or fails at once
with --no-wait), and the idle cluster ends itself through its guards with its last
controller killed, its bill covering every second of the nodes, idle gaps included.

The jobs keep their checkpoints in the workdir (`checkpoint: {dir: .}`) as the tutorials'
scripts do (the first runs `tests/fixtures/snapshot_train.py`: an in-place `snapshot.pt`, left
out of the sync by `.orchignore`): the second job finds no snapshot to resume from, and the
workdir on every node is intact after it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    detach,
    events,
    fast_env,
    job_json,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

AUTOSTOP_S = 20  # the idle cluster's, once the third job's controller is killed

# Records what torchrun gave each rank (in the node's home: the next job's sync makes the
# workdir the user's again, removing what a job wrote there), then waits for the test's file.
ENV_PROBE = """\
import json, os, sys, time
keys = ("ORCH_JOB_ID", "ORCH_NODE_RANK", "ORCH_NUM_NODES", "RANK", "WORLD_SIZE",
        "LOCAL_RANK", "MASTER_ADDR", "ORCH_MASTER_ADDR")
name = os.path.expanduser(f"~/env-{os.environ['ORCH_JOB_ID']}-{os.environ['RANK']}.json")
with open(name, "w") as out:
    json.dump({key: os.environ.get(key) for key in keys}, out)
print(f"step 1 loss 0.5 rank {os.environ['RANK']}", flush=True)
if len(sys.argv) > 1:
    deadline = time.time() + 120
    while not os.path.exists(os.path.expanduser(sys.argv[1])) and time.time() < deadline:
        time.sleep(0.2)
"""


# Two epochs of the tutorial-style script, a snapshot.pt saved after each.
SNAPSHOTS = "python snapshot_train.py --epochs 2 --epoch-s 0 --save-every 1"


def spec(tmp_path: Path, name: str, run: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nworkdir: work\nresources: {{nodes: 2, gpus_per_node: 1}}\n"
        "setup: echo ran >> ~/setup-runs.txt\n"  # outside the workdir: the sync keeps it
        "checkpoint: {dir: .}\n"
        f"run: {run}\n"
    )
    return path


def node_workdirs(home: Path, nodes: set[str]) -> list[Path]:
    """The kept cluster's workdir on each node (a local node's home is its `disk/` here)."""
    disks = [home / "local/nodes" / iid / "disk" for iid in sorted(nodes)]
    return [workdir for disk in disks for workdir in disk.glob("orch-jobs/*/workdir")]


def node_ids(job: dict) -> set[str]:
    return {lease["instance_id"] for lease in job["leases"]}


def node_log(home: Path, job_id: str) -> str:
    return "".join(path.read_text() for path in sorted((home / "jobs" / job_id).rglob("*.log")))


def test_jobs_share_a_kept_cluster_queue_for_it_and_its_guards_stop_it_when_idle(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "probe.py").write_text(ENV_PROBE)
    (work / "requirements.txt").write_text("numpy\n")
    shutil.copy(REPO / "tests" / "fixtures" / "snapshot_train.py", work)
    (work / ".orchignore").write_text("snapshot.pt\n")  # not synced, so not removed either
    home = tmp_path / "orch"
    env = fast_env(home, ORCH_STOP_GRACE="3")
    cluster = ["--cluster", "dev", "--autostop", f"{AUTOSTOP_S}s"]
    # Between the first two jobs the test runs orch commands of its own, a minute at worst
    # on a loaded machine: the cluster waits 10 minutes then. The third job's submit sets
    # AUTOSTOP_S (the latest submit's autostop is the cluster's), which ends it at the end.
    waiting = ["--cluster", "dev", "--autostop", "10m"]

    one_spec = spec(tmp_path, "one", f"python probe.py && {SNAPSHOTS}")
    first = run_orch(["submit", str(one_spec), *waiting], env)
    assert first.returncode == 0, first.stdout + first.stderr
    one = job_json(first.stdout.split()[1], env)
    assert one["state"] == "SUCCEEDED"
    nodes = node_ids(one)
    assert len(nodes) == 2

    # The second job holds the cluster until the test lets it go; meanwhile a --no-wait
    # submit is refused and a third job queues.
    go_two, go_three = tmp_path / "go-two", tmp_path / "go-three"
    # It fails if the first job's snapshot.pt is still in the workdir, where a tutorial-style
    # script would resume from it.
    two_spec = spec(tmp_path, "two", f"python probe.py {go_two} && test ! -e snapshot.pt")
    two_id = detach(two_spec, env, *waiting)
    wait_for_state(two_id, env, {"RUNNING"})
    refused = run_orch(
        ["submit", str(spec(tmp_path, "refused", "python probe.py")), *cluster, "--no-wait"], env
    )
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert f"cluster dev runs job {two_id}" in refused.stderr
    three_id = detach(spec(tmp_path, "three", f"python probe.py {go_three}"), env, *cluster)
    listed = wait_until(
        lambda: (
            (view := json.loads(run_orch(["status", "--json"], env, timeout=60).stdout))[
                "clusters"
            ][0]["queue"]
            and view
        ),
        "the third job in the cluster's queue",
        timeout=60,
    )
    (kept,) = listed["clusters"]
    assert (kept["name"], kept["job"], kept["queue"]) == ("dev", two_id, [three_id])
    assert [job["state"] for job in listed["jobs"] if job["id"] == three_id] == ["PENDING"]

    two = job_json(two_id, env)
    assert node_ids(two) == nodes, "the second job ran on other nodes"
    assert len(events(one, "PROVISIONING")) == 1
    (reused,) = events(two, "PROVISIONING")
    assert "nothing launched" in reused["message"]
    assert events(two, "REUSED")
    # Setup ran on each node for the first job only (same text, same requirements.txt).
    setup_runs = run_orch(["ssh", "dev", "--node", "1", "--", "cat", "setup-runs.txt"], env)
    assert setup_runs.stdout.split() == ["ran"], setup_runs.stderr
    # Torchrun's environment on reused nodes is that of fresh ones.
    for job_id in (one["id"], two_id):
        seen = run_orch(["ssh", "dev", "--node", "1", "--", "cat", f"env-{job_id}-1.json"], env)
        rank_1 = json.loads(seen.stdout)
        assert rank_1["ORCH_JOB_ID"] == job_id
        assert (rank_1["ORCH_NODE_RANK"], rank_1["WORLD_SIZE"], rank_1["ORCH_NUM_NODES"]) == (
            "1", "2", "2",
        )  # fmt: skip
        assert rank_1["MASTER_ADDR"] == rank_1["ORCH_MASTER_ADDR"]

    go_two.touch()
    two = wait_for_state(two_id, env, {"SUCCEEDED"})
    two_log = node_log(home, two_id)
    assert "setup: unchanged since it last ran on this node, skipped" in two_log
    # The first job's snapshot.pt was cleared from node 0's workdir by the reset, and the
    # workdir's own files are there, unchanged, on every node.
    assert '"event": "snapshot-saved", "epoch": 2' in node_log(home, one["id"])
    (reset,) = events(two, "RESET")
    assert "removed the last job's 1 checkpoint file(s)" in reset["message"]
    workdirs = node_workdirs(home, nodes)
    assert len(workdirs) == 2
    for workdir in workdirs:
        for name in ("probe.py", "requirements.txt", "snapshot_train.py", ".orchignore"):
            assert (workdir / name).read_bytes() == (work / name).read_bytes(), workdir / name
    # The third job runs; its controller is killed, and no orch command runs until the
    # idle cluster's guards have ended it.
    wait_for_state(three_id, env, {"RUNNING"})
    pid = int((home / "jobs" / three_id / "controller.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    go_three.touch()
    ledger = Ledger(make_engine(home / "orch.db"))
    wait_until(
        lambda: not any((home / "local/nodes" / iid).exists() for iid in nodes),
        "the kept nodes to end themselves",
        timeout=AUTOSTOP_S + 60,
    )
    assert time.monotonic() - killed_at >= AUTOSTOP_S - 1  # not before the autostop

    # The next command finds out: the job is adopted and ends, the cluster is DOWN.
    reconciled = run_orch(["reconcile"], env, timeout=120)
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    three = wait_for_state(three_id, env, {"FAILED", "SUCCEEDED"})
    assert "no run, no controller and idle GPUs" in (three["reason"] or "")
    assert_nothing_left(job_json(three_id, env))
    bill = json.loads(run_orch(["cost", "--json"], env).stdout)
    (down,) = bill["clusters"]
    assert down["state"] == "DOWN"
    assert down["jobs"] == [one["id"], two_id, three_id]
    assert down["idle_node_hours"] > 0  # the gap between the first two jobs, at least
    # Every second of each node's life is billed once: its leases, jobs' and idle, tile it.
    for iid in nodes:
        spans = sorted(
            [
                (lease.launched_at, lease.ended_at)
                for lease in ledger.leases()
                if lease.instance_id == iid
            ]
            + [
                (lease.launched_at, lease.ended_at)
                for lease in _idle_leases(ledger, kept["id"])
                if lease.instance_id == iid
            ]
        )
        assert all(end is not None for _, end in spans), spans
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert abs((start - end).total_seconds()) < 1e-6, spans


def _idle_leases(ledger: Ledger, cluster_id: str) -> list:
    from orchestrator.ledger.clusters import Clusters

    return Clusters(ledger).idle_leases(cluster_id)
