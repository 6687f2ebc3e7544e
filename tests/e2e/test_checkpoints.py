"""Checkpoints of the scripts people really run, on real local nodes with real torchrun (gloo):

- a tutorial-style DDP script whose rank 0 alone `torch.save`s `snapshot.pt` in place in its
  workdir every second (as Lightning rewrites `last.ckpt` every epoch): never quiet for the
  agent's second, the snapshot still reaches the mirror while the job runs, and when node 0
  dies without notice the loss is found within 10 s and the job resumes from a recent save
  instead of starting over;
- a sharded DCP job whose ranks each own a tensor: when node 1 dies without notice, every
  rank of the new nodes loads exactly what it saved at the last step that was complete on all
  nodes, downloaded from the checkpoint store.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    detach,
    events,
    fast_env,
    job_json,
    preempt,
    wait_for,
    wait_for_state,
)

pytestmark = pytest.mark.e2e

FIXTURES = REPO / "tests" / "fixtures"


def env_for(home: Path) -> dict[str, str]:
    return fast_env(home, ORCH_LOCAL_PRICE_PER_HOUR="0.90")


def json_lines(log: Path) -> list[dict]:
    """The JSON objects the ranks printed, from a node log (`[defaultN]:{...}` lines)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = re.match(r"^\[default\d+\]:(\{.*\})\s*$", line)
        if match:
            found.append(json.loads(match.group(1)))
    return found


def test_a_snapshot_saved_every_second_is_mirrored_and_resumed_after_node_0_is_lost(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "snapshot_train.py", work)
    (work / "job.yaml").write_text("# a copy of the spec, as users keep one in the workdir\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: tutorial\n"
        f"workdir: {work}\n"
        "run: python snapshot_train.py --epochs 40 --epoch-s 0.9 --save-every 1\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        "checkpoint: {dir: .}\n"  # the default pull_every (60 s): saves are seen, not polled
        "env: {OMP_NUM_THREADS: '1'}\n"
    )
    home = tmp_path / "orch"
    env = env_for(home)
    job_id = detach(spec, env)
    snapshots = lambda j: [e for e in events(j, "CHECKPOINT") if "snapshot.pt" in e["message"]]  # noqa: E731
    before = wait_for(
        job_id, env, lambda j: len(snapshots(j)) >= 3 and (j["step"] or 0) >= 10,
        "three mirrored snapshots, ten epochs",
    )  # fmt: skip
    assert before["state"] == "RUNNING"  # mirrored while it runs, not at the end
    taken = preempt(job_id, env, node=0, notice=0)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=300)
    assert job["state"] == "SUCCEEDED", job["events"][-10:]
    assert job["recoveries"] == 1 and job["step"] == 40
    detected = datetime.fromisoformat(events(job, "PREEMPTED")[0]["at"])
    assert (detected - datetime.fromisoformat(taken["reclaimed_at"])).total_seconds() <= 10

    lines = json_lines(home / "jobs" / job_id / "logs" / "node-0.log")
    saved = {e["sha256"]: e["epoch"] for e in lines if e.get("event") == "snapshot-saved"}
    (loaded,) = [e for e in lines if e.get("event") == "snapshot-loaded"]
    assert loaded["sha256"] in saved, "the resumed run loaded a snapshot no save wrote"
    # A recent save, not the start: at most a few epochs before the last step seen running.
    assert loaded["epoch"] == saved[loaded["sha256"]] >= before["step"] - 4
    killed_at = events(job, "PREEMPTED")[0]["at"]
    mirrored_before = [e for e in snapshots(job) if e["at"] < killed_at]
    assert len(mirrored_before) >= 3
    # Only what the run wrote is a checkpoint: not the script or the spec copy orch synced.
    assert {c["name"] for c in job["checkpoints"]} == {"snapshot.pt"}
    assert_nothing_left(job)


def test_a_sharded_dcp_job_loses_node_1_and_every_rank_resumes_what_it_saved(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "dcp_train.py", work)
    store = tmp_path / "store"
    store.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: sharded\n"
        f"workdir: {work}\n"
        "run: python dcp_train.py --steps 40 --step-s 0.3 --save-every 4 --size 65536\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        f"checkpoint: {{dir: ~/ckpt, store: 'file://{store}'}}\n"  # mirror: latest (default)
        "env: {OMP_NUM_THREADS: '1'}\n"
    )
    home = tmp_path / "orch"
    env = env_for(home)
    job_id = detach(spec, env)
    stored = lambda j: [c for c in j["checkpoints"] if c.get("stored")]  # noqa: E731
    wait_for(job_id, env, lambda j: len(stored(j)) >= 2, "two stored sharded steps")
    preempt(job_id, env, node=1, notice=0)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=300)
    assert job["state"] == "SUCCEEDED", job["events"][-10:]
    assert job["recoveries"] == 1 and job["step"] == 40

    killed_at = events(job, "PREEMPTED")[0]["at"]
    complete_before = [e["step"] for e in events(job, "CHECKPOINT") if e["at"] < killed_at]
    (resumed,) = events(job, "RESUMED")
    assert resumed["step"] == max(complete_before), (resumed, complete_before)
    # From the store, unless the newest step reached the mirror before its upload finished (a
    # loaded machine): then the mirror, newer, is pushed. Its store copy is checked below.
    put_back = events(job, "RESTORED") + events(job, "PUSHED")
    assert len(put_back) == 1, put_back
    if events(job, "RESTORED"):
        assert "from the store to 2 node(s)" in put_back[0]["message"]
    else:
        assert "to 2 node(s)" in put_back[0]["message"]

    logs = home / "jobs" / job_id / "logs"
    lines = json_lines(logs / "node-0.log") + json_lines(logs / "node-1.log")
    step = resumed["step"]
    saved = {
        e["rank"]: e["sha256"] for e in lines if e.get("event") == "saved" and e["step"] == step
    }
    restored = {e["rank"]: e["sha256"] for e in lines if e.get("event") == "restored"}
    assert sorted(restored) == [0, 1, 2, 3]
    assert restored == saved, "a rank resumed from something other than what it saved"
    whole = [".metadata", *[f"__{r}_0.distcp" for r in range(4)]]
    held = {e["rank"]: e["files"] for e in lines if e.get("event") == "restored"}
    assert all(files == whole for files in held.values()), held  # not just each node's own
    # Every shard came from its own node; the store keeps the newest step whole. (The resumed
    # step itself may be gone from the store by now: when the mirror held it first, nothing
    # uploaded it, and newer steps superseded it.)
    record = max((c for c in job["checkpoints"] if c.get("stored")), key=lambda c: c["step"])
    newest = f"step-{record['step']:06d}"
    assert record["step"] >= step
    assert sorted(f["path"] for f in record["files"]) == [
        f"{newest}/.metadata",
        *[f"{newest}/__{r}_0.distcp" for r in range(4)],
    ]
    assert all((store / f["key"]).is_file() for f in record["files"])
    assert job_json(job_id, env)["checkpoints"], "the ledger lists what is kept"
    assert_nothing_left(job)
