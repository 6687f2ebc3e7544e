"""Jobs on a fleet of machines the user already has: how soon they start.

Two machines are started as a user's own (`tests/support/fleet_hosts.py`: real sshd, own
address and home, two GPUs each through the nvidia-smi stand-in) and added as fleet `bench`.

- Start: the same 2-node job (one process a node, `launcher: none`, a one-line script) is
  submitted in the foreground on the free fleet and on new local nodes, alternately, `--repeats`
  times each. Each time is read from orch's own records: from the job's creation to its
  RUNNING event (every node's run started). Target: the fleet's median at most 0.3x the
  local nodes' (nothing to boot: the fleet's machines are up).
- Queue: a job holding every GPU of the fleet runs a few seconds; a second one, submitted
  while it runs, waits in the fleet's queue. The time from the first job's end (its
  `ended_at`) to the second one's RUNNING event, `--queue-repeats` times. Target: median at
  most 5 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import at, median, report_targets  # noqa: E402
from tests.support.fleet_hosts import fleet_machines  # noqa: E402
from tests.support.helpers import detach, fast_env, job_json, run_orch  # noqa: E402


def to_running_s(job: dict) -> float:
    """Seconds from the job's creation to its (last) RUNNING event."""
    running = [e["at"] for e in job["events"] if e["kind"] == "RUNNING"]
    return at(running[-1]) - at(job["created_at"])


def _spec(root: Path, name: str, provider: str, run: str, gpus: int) -> Path:
    spec = root / f"{name}.yaml"
    fleet = "fleet: bench\n" if provider == "ssh" else ""
    spec.write_text(
        f"name: {name}\nworkdir: work\nlauncher: none\nprovider: {provider}\n{fleet}"
        f"resources: {{nodes: 2, gpus_per_node: {gpus}}}\nrun: {run}\n"
    )
    return spec


def _submitted(spec: Path, env: dict[str, str]) -> dict:
    """Submit `spec` in the foreground; the job's `orch status JOB --json` once it ended."""
    done = run_orch(["submit", str(spec), "--yes"], env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    listed = json.loads(run_orch(["status", "--json"], env).stdout)
    return job_json(listed["jobs"][0]["id"], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--queue-repeats", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-fleet-") as tmp:
        root = Path(tmp)
        (root / "work").mkdir()
        (root / "work" / "probe.py").write_text("print('step 1 loss 0.5', flush=True)\n")
        env = fast_env(root / "home")
        with fleet_machines(root, gpus=(2, 2)) as machines:
            hosts = [a for m in machines for a in ("--host", m.login)]
            added = run_orch(["fleet", "add", "bench", *hosts, "--identity", str(machines[0].key)],
                             env, timeout=120)  # fmt: skip
            if added.returncode != 0:
                raise RuntimeError(added.stdout + added.stderr)
            fleet_s, local_s = [], []
            for repeat in range(options.repeats):
                for provider, found in (("ssh", fleet_s), ("local", local_s)):
                    spec = _spec(root, f"start-{provider}", provider, "python probe.py", 1)
                    found.append(to_running_s(_submitted(spec, env)))
                    print(f"  start {repeat + 1} on {provider}: {found[-1]:.2f} s", flush=True)
            waits = []
            for repeat in range(options.queue_repeats):
                blocking = detach(_spec(root, "blocking", "ssh", "sleep 4", 2), env, "--yes")
                while job_json(blocking, env)["state"] != "RUNNING":
                    time.sleep(0.2)
                queued = detach(_spec(root, "queued", "ssh", "python probe.py", 2), env, "--yes")
                while (job := job_json(queued, env))["state"] not in ("SUCCEEDED", "FAILED"):
                    time.sleep(0.5)
                ended = job_json(blocking, env)["ended_at"]
                waits.append(to_running_s({**job, "created_at": ended}))
                print(f"  queue {repeat + 1}: started {waits[-1]:.2f} s after the end",
                      flush=True)  # fmt: skip
    ok = report_targets(
        "Jobs on a fleet of 2 machines (2 GPUs each): start and queue",
        [
            (
                "submit to every rank started, free fleet",
                median(fleet_s),
                "s",
                median(local_s),
                "the same job on new local nodes",
                "ratio <= 0.3",
            ),
            (
                "queued job's start after the blocking end",
                median(waits),
                "s",
                5.0,
                "the target, 5 s",
                "<= 5",
            ),
        ],  # fmt: skip
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
