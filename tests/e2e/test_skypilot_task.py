"""A SkyPilot task file, written as SkyPilot's docs write one, submitted unchanged: its run
starts its own torchrun on each of 2 real nodes from SkyPilot's variables, and the ranks find
each other, all-reduce and finish; orch follows the progress rank 0 prints and bills it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.support.helpers import REPO, assert_nothing_left, fast_env, run_orch

pytestmark = pytest.mark.e2e

TASK = """\
name: minGPT-ddp

workdir: .

num_nodes: 2

resources:
  accelerators: A10G:2

envs:
  OMP_NUM_THREADS: "1"

setup: |
  echo "Begin setup."

run: |
  MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  echo "Starting distributed training, head node: $MASTER_ADDR"
  torchrun \\
    --nnodes=$SKYPILOT_NUM_NODES \\
    --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE \\
    --node_rank=${SKYPILOT_NODE_RANK} \\
    --master_addr=$MASTER_ADDR \\
    --master_port=8008 \\
    skypilot_ddp.py --steps 6
"""


def test_a_skypilot_task_runs_a_two_node_torchrun_job_unchanged(tmp_path: Path) -> None:
    work = tmp_path / "task"
    work.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "skypilot_ddp.py", work)
    (work / "task.yaml").write_text(TASK)
    env = fast_env(tmp_path / "orch", ORCH_LOCAL_PRICE_PER_HOUR="0.40")
    result = run_orch(["submit", str(work / "task.yaml"), "--json"], env, timeout=300)
    job = json.loads(result.stdout)
    assert result.returncode == 0, (job.get("reason"), result.stderr[-2000:])
    assert job["state"] == "SUCCEEDED" and job["nodes"] == 2 and job["gpus_per_node"] == 2
    assert job["step"] == 6  # rank 0's own lines, with no torchrun prefix, are its progress
    assert job["id"].startswith("mingpt-ddp")
    done = {}
    for node in (0, 1):
        log = run_orch(["logs", job["id"], "--node", str(node)], env).stdout
        assert "Begin setup." in log and "head node: " in log
        # Two ranks of a node write to one stream, unprefixed: a line may hold both objects.
        for match in re.finditer(r'\{"event": "rank-done"[^{}]*\}', log):
            event = json.loads(match.group(0))
            done[event["rank"]] = (node, event["world"], event["ok"])
    assert done == {0: (0, 4, True), 1: (0, 4, True), 2: (1, 4, True), 3: (1, 4, True)}
    rank0 = run_orch(["logs", job["id"]], env).stdout  # node 0's whole log: no rank prefixes
    assert "head node: " in rank0 and '"rank-done"' in rank0
    assert float(job["spend_usd"]) > 0
    assert_nothing_left(job)
