"""CPU a detached controller spends watching 8 local nodes at a 5 s interval, for 60 s.

The job is 8 nodes x 1 process that only sleep, so everything the controller process does is
the watching: probes, log mirroring, budget checks, APScheduler. Target: under 3 % of one core.
The baseline, measured in the same run, is an `orch status --json` loop doing nothing but
reading the ledger every 5 s for the same 60 s (what a person watching a job costs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator.cli"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def orch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "orch"
        (Path(tmp) / "work").mkdir()
        spec = Path(tmp) / "job.yaml"
        spec.write_text(
            "name: watch-bench\nworkdir: work\n"
            'run: python -c "import time; time.sleep(100000)"\n'
            f"resources: {{nodes: {args.nodes}, gpus_per_node: 1}}\n"
        )
        env = dict(os.environ, ORCH_HOME=str(home), ORCH_WATCH_INTERVAL=str(args.interval))
        submitted = orch(["submit", str(spec), "--detach"], env)
        job_id = submitted.stdout.split()[-1]
        try:
            while json.loads(orch(["status", job_id, "--json"], env).stdout)["state"] != "RUNNING":
                time.sleep(1)
            time.sleep(15)  # let the ranks finish importing torch
            pid = int((home / "jobs" / job_id / "controller.pid").read_text())
            before, start = cpu_seconds(pid), time.monotonic()
            time.sleep(args.seconds)
            controller = (cpu_seconds(pid) - before) / (time.monotonic() - start) * 100

            reader = subprocess.Popen(
                [sys.executable, "-c",
                 "import subprocess, sys, time\n"
                 f"end = time.monotonic() + {args.seconds}\n"
                 "while time.monotonic() < end:\n"
                 f"    subprocess.run({ORCH!r} + ['status', '{job_id}', '--json'],"
                 " capture_output=True)\n"
                 f"    time.sleep({args.interval})\n"],
                env=env, cwd=REPO,
            )  # fmt: skip
            start = time.monotonic()
            usage_before = os.times()
            reader.wait()
            usage = os.times()
            children = (usage.children_user + usage.children_system) - (
                usage_before.children_user + usage_before.children_system
            )
            baseline = children / (time.monotonic() - start) * 100
        finally:
            orch(["cancel", job_id], env)
    print(
        f"\ncontroller CPU watching {args.nodes} nodes every {args.interval:g} s for "
        f"{args.seconds:g} s: {controller:.2f} % of one core (target < 3 %)\n"
        f"baseline, `orch status --json` every {args.interval:g} s: {baseline:.2f} % "
        f"(ratio {controller / baseline:.2f})"
    )
    return 0 if controller < 3 else 1


if __name__ == "__main__":
    sys.exit(main())
