"""Checkpoints of the scripts people really run, on real local nodes with real torchrun (gloo):

- a tutorial-style DDP script whose rank 0 alone `torch.save`s `snapshot.pt` in place in its
  workdir every second (as Lightning rewrites `last.ckpt` every epoch): never quiet for the
  agent's second, the snapshot still reaches the mirror while the job runs, and when node 0
  dies without notice the loss is found within 10 s and the job resumes from a recent save
  instead of starting over. It prints the tutorial's plain `[GPU0] Epoch N | ...` lines, no
  JSON step line: its `progress.pattern` makes its epochs the job's steps;
- a sharded DCP job whose ranks each own a tensor and that resumes the newest step it finds
  (as torchtitan does): when node 1 dies without notice right after a save, its shards of that
  step never taken, the step node 0 still holds is set aside and every rank loads exactly what
  it saved at the last step that was whole on all nodes, downloaded from the checkpoint store.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    detach,
    events,
    fast_env,
    preempt,
    run_orch,
    timeline,
    wait_for,
    wait_for_state,
)
from tests.support.waiting import wait_until

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
        "run: python snapshot_train.py --epochs 40 --epoch-s 0.9 --save-every 1 --plain\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        "checkpoint: {dir: .}\n"  # the default pull_every (60 s): saves are seen, not polled
        "progress: {pattern: '\\[GPU0\\] Epoch (?P<step>\\d+) \\|'}\n"
        "env: {OMP_NUM_THREADS: '1'}\n"
    )
    home = tmp_path / "orch"
    env = env_for(home)
    job_id = detach(spec, env)
    snapshots = lambda j: [e for e in events(j, "CHECKPOINT") if "snapshot.pt" in e["message"]]  # noqa: E731
    seen: set[str] = set()  # versions of snapshot.pt seen in the mirror while the job runs

    def mirrored(j: dict) -> bool:
        seen.update(c["digest"] for c in j["checkpoints"] if c["name"] == "snapshot.pt")
        return len(seen) >= 3 and (j["step"] or 0) >= 10

    before = wait_for(job_id, env, mirrored, "three mirrored snapshots, ten epochs")
    assert before["state"] == "RUNNING"  # mirrored while it runs, not at the end
    taken = preempt(job_id, env, node=0, notice=0)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=300)
    assert job["state"] == "SUCCEEDED", job["events"][-10:]
    assert job["recoveries"] == 1 and job["step"] == 39  # the last epoch's line: `Epoch 39`
    detected = datetime.fromisoformat(events(job, "PREEMPTED")[0]["at"])
    detection_s = (detected - datetime.fromisoformat(taken["reclaimed_at"])).total_seconds()
    assert detection_s <= 10, f"found {detection_s:.1f} s after\n{timeline(job, home)}"

    lines = json_lines(home / "jobs" / job_id / "logs" / "node-0.log")
    (loaded,) = [e for e in lines if e.get("event") == "snapshot-loaded"]
    first_run = lines[: lines.index(loaded)]
    saved = {e["sha256"]: e["epoch"] for e in first_run if e.get("event") == "snapshot-saved"}
    if loaded["sha256"] in saved:
        assert loaded["epoch"] == saved[loaded["sha256"]]
    else:
        # a save whose log line died with node 0: its snapshot was fetched (on the agent's
        # word, at once) before the line reached the log mirror (at the next watch tick), so
        # it is newer than every save logged; and it loaded whole (the run went on from it)
        assert loaded["epoch"] > max(saved.values()), (loaded, sorted(saved.values()))
    # A recent save, not the start: at most a few epochs before the last step seen running.
    assert loaded["epoch"] >= before["step"] - 4
    killed_at = datetime.fromisoformat(events(job, "PREEMPTED")[0]["at"])
    versions = Ledger(make_engine(home / "orch.db")).checkpoints(job_id)  # pruned ones too
    assert len([v for v in versions if v.pulled_at < killed_at]) >= 3
    # a version per save, but not an event per version: a minute's versions share one
    assert 1 <= len(snapshots(job)) < len(versions), (len(snapshots(job)), len(versions))
    # Only what the run wrote is a checkpoint: not the script or the spec copy orch synced.
    assert {c["name"] for c in job["checkpoints"]} == {"snapshot.pt"}
    # Long after, `orch status` shows the recovery: its events, what it kept, its count.
    shown = run_orch(["status", job_id], {**env, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for kind in ("PREEMPTED", "SALVAGED", "RECOVERING", "RESUMED"):
        assert f"│ {kind} " in shown.stdout, shown.stdout
    assert re.search(r"SALVAGED .*│ newest checkpoint snapshot\.pt \(pulled at step", shown.stdout)
    assert re.search(r"^recoveries\s+1\s*$", shown.stdout, re.M), shown.stdout
    assert_nothing_left(job)


def test_a_sharded_dcp_job_that_resumes_the_newest_step_it_finds_loses_node_1_right_after_a_save(
    tmp_path: Path,
) -> None:
    """The script resumes as torchtitan does (rank 0 picks the newest `step-N` holding
    `.metadata`, whatever ORCH_RESUME_FROM says). Node 1 dies right after step 12 was saved,
    its shards of it never taken; node 0 keeps step 12's `.metadata` and its own shards. The
    restart sets step 12 aside on node 0, so every rank resumes step 8, whole, from the store."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "dcp_train.py", work)
    store = tmp_path / "store"
    store.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: sharded\n"
        f"workdir: {work}\n"
        "run: python dcp_train.py --steps 20 --step-s 0.3 --save-every 4 --size 65536"
        " --resume newest --hold-at 12\n"
        "resources: {nodes: 2, gpus_per_node: 2, spot: true}\n"
        f"checkpoint: {{dir: ~/ckpt, store: 'file://{store}'}}\n"  # mirror: latest (default)
        "env: {OMP_NUM_THREADS: '1'}\n"
    )
    home = tmp_path / "orch"
    env = env_for(home)
    job_id = detach(spec, env)
    stored = lambda j: {c["step"] for c in j["checkpoints"] if c.get("stored")}  # noqa: E731
    before = wait_for(job_id, env, lambda j: 8 in stored(j), "step 8 stored")
    disks = {
        lease["rank"]: home / "local" / "nodes" / lease["instance_id"] / "disk"
        for lease in before["leases"]
    }
    held = disks[0] / "ckpt" / "step-000012"
    wait_until(lambda: (held / ".metadata").is_file(), "step 12 saved", 120, interval=0.2)
    assert (disks[1] / "ckpt" / "step-000012" / "__2_0.distcp").is_file()
    preempt(job_id, env, node=1, notice=0)
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=300)
    assert job["state"] == "SUCCEEDED", job["events"][-12:]
    assert job["recoveries"] == 1 and job["step"] == 20
    assert not events(job, "FALLBACK")  # set aside before the start, not recovered after

    killed_at = events(job, "PREEMPTED")[0]["at"]
    complete_before = [e["step"] for e in events(job, "CHECKPOINT") if e["at"] < killed_at]
    assert max(complete_before) == 8, complete_before  # step 12 never reached orch whole
    (resumed,) = events(job, "RESUMED")
    assert resumed["step"] == 8, resumed
    (aside,) = events(job, "SET_ASIDE")
    moved = f"node 0: step-000012 moved to ~/orch-jobs/{job_id}/set-aside/"
    assert aside["message"].startswith(moved) and "step-000008" in aside["message"], aside

    logs = home / "jobs" / job_id / "logs"
    lines = json_lines(logs / "node-0.log") + json_lines(logs / "node-1.log")
    chosen = {e["rank"]: (e["chosen"], e["orch_resume_from"]) for e in lines
              if e.get("event") == "chosen" and e["chosen"]}  # fmt: skip
    assert chosen == {rank: ("step-000008", "step-000008") for rank in range(4)}, chosen
    saved = {e["rank"]: e["sha256"] for e in lines if e.get("event") == "saved" and e["step"] == 8}
    restored = {e["rank"]: e["sha256"] for e in lines if e.get("event") == "restored"}
    assert sorted(restored) == [0, 1, 2, 3]
    assert restored == saved, "a rank resumed from something other than what it saved"
    whole = [".metadata", *[f"__{r}_0.distcp" for r in range(4)]]
    files = {e["rank"]: e["files"] for e in lines if e.get("event") == "restored"}
    assert all(names == whole for names in files.values()), files  # not just each node's own
    assert all((store / f["key"]).is_file() for c in job["checkpoints"] for f in c["files"]
               if c.get("stored"))  # fmt: skip
    assert_nothing_left(job)
