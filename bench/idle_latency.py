"""Idle-shutdown latency: from the moment every GPU drops to 0 % to the controller's stop.

Two local nodes whose nvidia-smi is the trace-replaying stand-in of the tests; the trace goes
from busy to idle while the job runs. With the default 5 s watch interval, the bound is
idle_timeout + 2 intervals; the figure printed is the median over the trials and its
overhead beyond idle_timeout, in watch intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator.cli"]


def trace(util: float) -> str:
    return json.dumps({"mode": "normal", "gpus": [[util, 1000, 81559]]})


def orch(args: list[str], env: dict[str, str]) -> str:
    return subprocess.run(
        [*ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def one_trial(idle_timeout: float, interval: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "work").mkdir()
        node_bin = root / "node-bin"
        node_bin.mkdir()
        shutil.copy(REPO / "tests/fixtures/nvidia_smi_replay.py", node_bin / "nvidia-smi")
        (node_bin / "nvidia-smi.trace").write_text(trace(90))
        spec = root / "job.yaml"
        spec.write_text(
            "name: idle-bench\nworkdir: work\n"
            'run: python -c "import time; time.sleep(100000)"\n'
            "data: [{src: node-bin, dst: ~/bin}]\n"
            "resources: {nodes: 2, gpus_per_node: 1}\n"
            f"budget: {{idle_timeout: {idle_timeout}}}\n"
        )
        env = dict(os.environ, ORCH_HOME=str(root / "orch"), ORCH_WATCH_INTERVAL=str(interval))
        job_id = orch(["submit", str(spec), "--detach"], env).split()[-1]
        while (job := json.loads(orch(["status", job_id, "--json"], env)))["state"] != "RUNNING":
            time.sleep(0.5)
        time.sleep(2 * interval)
        dropped = time.time()
        for lease in job["leases"]:
            disk = root / "orch/local/nodes" / lease["instance_id"] / "disk/bin"
            (disk / "t.tmp").write_text(trace(0))
            (disk / "t.tmp").replace(disk / "nvidia-smi.trace")
        while (job := json.loads(orch(["status", job_id, "--json"], env)))["state"] == "RUNNING":
            time.sleep(0.5)
        stop = next(e for e in job["events"] if e["kind"] == "STOPPING")
        while not json.loads(orch(["status", job_id, "--json"], env))["ended_at"]:
            time.sleep(0.5)
        return datetime.fromisoformat(stop["at"]).timestamp() - dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    latencies = [one_trial(args.idle_timeout, args.interval) for _ in range(args.trials)]
    median = statistics.median(latencies)
    overhead = (median - args.idle_timeout) / args.interval
    print(
        f"\nidle-shutdown latency (idle_timeout {args.idle_timeout:g} s, watch interval "
        f"{args.interval:g} s): median {median:.1f} s over {args.trials} trials "
        f"{[round(x, 1) for x in latencies]}; beyond the timeout: {overhead:.2f} intervals "
        "(bound 2)"
    )
    return 0 if args.idle_timeout <= median <= args.idle_timeout + 2 * args.interval else 1


if __name__ == "__main__":
    sys.exit(main())
