"""Instance-seconds billed after the controller dies, with a hung job: the node guard's floor.

Two hanging 2-node jobs run side by side on local nodes (the run ignores SIGTERM and sleeps,
as a deadlocked NCCL job does). Once both run, each controller gets SIGKILL and no orch command
runs afterwards, as with a closed laptop.

- guarded: `budget: {max_runtime: R}`; its nodes' guards count R on the node and power off.
  The figure is the instance-seconds from the kill to each node's power-off, summed.
- baseline: the same job with no limit, which bills as any hung job did before nodes had a
  guard (their watchdog powered off only once training had ended): the instance-seconds over
  the same observation window, still growing when the window closes. It is then cancelled.

    .venv/bin/python -m bench.guard_billing [--max-runtime 30] [--trials 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator.cli"]
HANG = (
    'python3 -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
    'time.sleep(100000)"'
)
GRACE_S = 3  # controller.stop_grace: SIGTERM, then this long, then SIGKILL


class Job:
    """One detached hanging job in its own ORCH_HOME."""

    def __init__(self, root: Path, name: str, budget: str) -> None:
        self.home = root / name
        (self.home / "work").mkdir(parents=True)
        spec = self.home / "job.yaml"
        spec.write_text(
            f"name: {name}\nworkdir: work\nrun: {json.dumps(HANG)}\n"
            f"resources: {{nodes: 2, gpus_per_node: 1}}\nbudget: {budget}\n"
        )
        self.env = dict(
            os.environ, ORCH_HOME=str(self.home / "orch"), ORCH_STOP_GRACE=str(GRACE_S),
            ORCH_WATCH_INTERVAL="1",
        )  # fmt: skip
        self.id = self.orch("submit", str(spec), "--detach").split()[-1]

    def orch(self, *args: str) -> str:
        return subprocess.run(
            [*ORCH, *args], env=self.env, cwd=REPO, capture_output=True, text=True, check=True
        ).stdout

    def status(self) -> dict:
        return json.loads(self.orch("status", self.id, "--json"))

    def instance_ids(self) -> list[str]:
        return [lease["instance_id"] for lease in self.status()["leases"]]

    def kill_controller(self) -> float:
        pid = int((self.home / "orch/jobs" / self.id / "controller.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        return time.time()

    def powered_off_at(self, instance_id: str) -> float | None:
        """When the node stopped billing by itself, as the local provider records it."""
        record = self.home / "orch/local/powered-off" / f"{instance_id}.json"
        if not record.exists():
            return None
        return datetime.fromisoformat(json.loads(record.read_text())["at"]).timestamp()


def wait_running(jobs: list[Job], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while any(job.status()["state"] != "RUNNING" for job in jobs):
        if time.monotonic() > deadline:
            raise SystemExit("the jobs did not reach RUNNING")
        time.sleep(0.5)


def one_trial(max_runtime: float) -> tuple[float, float, float]:
    """(guarded instance-seconds after the kill, baseline's over the window, window seconds)."""
    window = max_runtime + GRACE_S + 30
    with tempfile.TemporaryDirectory(prefix="orch-bench-guard-") as tmp:
        root = Path(tmp)
        guarded = Job(root, "guarded", f"{{max_runtime: {max_runtime:g}}}")
        baseline = Job(root, "unlimited", "{}")
        try:
            wait_running([guarded, baseline])
            guarded_ids, baseline_ids = guarded.instance_ids(), baseline.instance_ids()
            killed = {job.id: job.kill_controller() for job in (guarded, baseline)}
            while time.time() < killed[guarded.id] + window:
                time.sleep(0.5)
            ends = [guarded.powered_off_at(iid) for iid in guarded_ids]
            if any(end is None for end in ends):
                raise SystemExit(f"guarded nodes still up {window:.0f} s after the kill")
            billed = sum(end - killed[guarded.id] for end in ends if end is not None)
            if any(baseline.powered_off_at(iid) is not None for iid in baseline_ids):
                raise SystemExit("the unlimited job's nodes ended by themselves")
            closed = time.time()
            unguarded = len(baseline_ids) * (closed - killed[baseline.id])
            return billed, unguarded, closed - killed[baseline.id]
        finally:
            for job in (guarded, baseline):
                subprocess.run(
                    [*ORCH, "cancel", job.id], env=job.env, cwd=REPO, capture_output=True,
                    timeout=180,
                )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-runtime", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    trials = [one_trial(args.max_runtime) for _ in range(args.trials)]
    for n, (billed, unguarded, window) in enumerate(trials):
        print(f"  trial {n}: guarded {billed:.1f} instance-s, unlimited {unguarded:.1f} "
              f"instance-s over {window:.0f} s and still billing")  # fmt: skip
    billed = statistics.median(t[0] for t in trials)
    unguarded = statistics.median(t[1] for t in trials)
    window = statistics.median(t[2] for t in trials)
    # The guard's bound per node: what is left of max_runtime at the kill, + grace + poweroff.
    bound = 2 * (args.max_runtime + GRACE_S + 15)
    print(
        f"\nbilled after the controller's death (2 nodes, hung job; medians of {args.trials}):\n"
        f"  guarded (max_runtime {args.max_runtime:g} s)   {billed:8.1f} instance-s   "
        f"bound {bound:.0f}\n"
        f"  no limit (as before the guard)  {unguarded:8.1f} instance-s in {window:.0f} s, "
        "growing by 2 per second until someone acts"
    )
    return 0 if billed <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
