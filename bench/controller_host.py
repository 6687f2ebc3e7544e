"""Controller host overhead: a job driven by a controller host against the same job driven by
the laptop's own controller, in the same run, on local nodes.

One controller host is set up once (`orch controller up --provider local`, timed and shown, not
a figure). Then each trial submits the reference trainer (tiny model, 2 nodes x 1 rank, spot)
twice, one after the other, in an order that alternates from trial to trial:

- laptop: `orch submit --detach --no-remote` (a detached controller on this machine);
- host: `orch submit --remote --detach` (the spec and workdir go to the host, whose orch
  provisions, watches and recovers).

For each it measures:

- submit -> first step: from the `orch submit` call to the first step line of rank 0
  (`{"step":1,...}`), read on the node's disk;
- recovery: after the first checkpoint, node 1 is reclaimed with a notice
  (`orch local preempt JOB --node 1 --notice N`; for the host's job that command runs on the
  host, whose local provider owns the job's nodes); from the job's PREEMPTED event to every
  rank's start line of the resumed run (what a user waits, new node's launch included).

Then the job is cancelled and waited for. The host's figure / the laptop's is the ratio; medians
over `--trials`. The nodes' logs are read on their disks (for the host's job, inside the host
node's disk) so that waiting costs no `orch` process. Everything started is ended on the way
out, failure included: the jobs, the host's jobs' nodes, the host, the laptop's nodes.

    .venv/bin/python -m bench.controller_host [--trials 3] [--notice 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import at, machine, wait
from orchestrator.config import load_settings
from orchestrator.host import record as host_records
from orchestrator.host.layout import HostLayout, orch_command
from orchestrator.host.session import HostSession
from orchestrator.providers.local.provider import LocalProvider

REPO = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator.cli"]
RANKS = 2
FINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "IDLE_STOPPED", "TIMED_OUT", "BUDGET_STOPPED"}
START_LINE = re.compile(r"trainer rank=\d+ world_size=")
STEP_LINE = re.compile(r'\{"step":\d+,')  # rank 0's progress lines (after torchrun's prefix)
CHECKPOINT = re.compile(r'\{"event":"checkpoint",')

JOB = """\
name: host-bench
workdir: {workdir}
run: >-
  python -m orch_trainer.train --model tiny --data fake --fake-size 1000000 --epochs 1
  --batch-size 128 --workers 0 --checkpoint-every 50 --log-every 1
resources: {{nodes: {nodes}, gpus_per_node: 1, spot: true}}
checkpoint: {{dir: ~/ckpt, pull_every: 10}}
recovery: {{max_recoveries: 3}}
env: {{OMP_NUM_THREADS: "1"}}
"""


def orch(args: list[str], env: dict[str, str], *, timeout: float = 300) -> str:
    """`orch ARGS` on this machine; its stdout. Raises with its output when it fails."""
    done = subprocess.run(
        [*ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"orch {' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")  # fmt: skip
    return done.stdout


@dataclass
class Controller:
    """Where a job's controller runs: how to submit to it, where its nodes' disks are seen from
    here, and how to reclaim one of its job's nodes."""

    name: str  # "laptop" or "host"
    submit_flags: list[str]
    local_roots: list[Path]  # local provider roots (`nodes/<id>/disk`) the job's nodes may be in
    preempt: Callable[[str, float], dict[str, Any]]  # job, notice -> `orch local preempt --json`

    def logs(self, job_id: str) -> list[Path]:
        pattern = f"nodes/*/disk/orch-jobs/{job_id}/run/node.log"
        return [log for root in self.local_roots for log in root.glob(pattern)]

    def read(self, job_id: str, pattern: re.Pattern[str]) -> dict[str, int]:
        """Lines matching `pattern` in each live node's log of the job (node id -> count)."""
        counts: dict[str, int] = {}
        for log in self.logs(job_id):
            try:
                counts[log.parents[4].name] = len(pattern.findall(log.read_text(errors="replace")))
            except OSError:
                continue
        return counts


def preempt_argv(job_id: str, notice: float) -> list[str]:
    return ["local", "preempt", job_id, "--node", "1", "--notice", f"{notice:g}", "--json"]


def last_json(text: str) -> dict[str, Any]:
    return json.loads(text.strip().splitlines()[-1])


def laptop(home: Path, env: dict[str, str]) -> Controller:
    return Controller(
        "laptop",
        ["--detach", "--no-remote"],
        [home / "local"],
        lambda job_id, notice: last_json(orch(preempt_argv(job_id, notice), env)),
    )


def host(home: Path) -> Controller:
    """The controller host of `home` (set up): its orch runs `orch local preempt` there, since
    the job's nodes are its local provider's. A host in a network namespace keeps them inside
    itself, under its own ORCH_HOME; one in loopback mode beside this ORCH_HOME's own nodes."""
    record = host_records.require(home)
    layout = HostLayout(record.root)
    if record.instance_id is None:
        raise RuntimeError("the benchmark launches its host; this one was adopted")
    store = LocalProvider(load_settings({"ORCH_HOME": str(home)})).store
    node = store.load(record.instance_id)
    if node is None:
        raise RuntimeError(f"the host's node {record.instance_id} has no record")
    # The host's HOME is its node's disk (mounted on NODE_HOME in a namespace node).
    root = store.node_dir(node.instance_id) / "disk" / Path(layout.home).relative_to(node.home)
    root = root / "local"

    def preempt(job_id: str, notice: float) -> dict[str, Any]:
        session = HostSession(home, record)
        try:
            result = session.run(orch_command(layout, preempt_argv(job_id, notice)))
            return last_json(result.stdout)
        finally:
            session.close()

    return Controller("host", ["--remote", "--detach"], [root, home / "local"], preempt)


def status(job_id: str, env: dict[str, str]) -> dict[str, Any]:
    return json.loads(orch(["status", job_id, "--json"], env))


def end_job(job_id: str, env: dict[str, str], timeout: float = 120) -> None:
    """Cancel the job unless it ended, and wait until it has (its nodes are gone then)."""
    if status(job_id, env)["state"] not in FINAL:
        subprocess.run([*ORCH, "cancel", job_id], env=env, cwd=REPO, capture_output=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    wait(lambda: status(job_id, env)["state"] in FINAL, f"{job_id} to end", timeout, every=2)


def measure(
    controller: Controller, spec: Path, env: dict[str, str], notice: float, jobs: list[str]
) -> dict[str, float]:
    """One job through `controller`: submit -> first step, then reclaim -> every rank back."""
    started = time.time()
    job_id = orch(["submit", str(spec), *controller.submit_flags], env).strip().splitlines()[-1]
    submitted = time.time()
    jobs.append(job_id)
    first = wait(
        lambda: sum(controller.read(job_id, STEP_LINE).values()) and time.time(),
        f"{controller.name}: first step of {job_id}",
    )
    wait(lambda: sum(controller.read(job_id, CHECKPOINT).values()), "a checkpoint")

    before = controller.read(job_id, START_LINE)

    def resumed() -> float | None:
        now = controller.read(job_id, START_LINE)
        back = sum(count - before.get(node, 0) for node, count in now.items())
        return time.time() if back >= RANKS else None

    # `orch local preempt` returns once the node is taken or let go: recovery is timed beside it.
    with ThreadPoolExecutor(1) as background:
        reclaim = background.submit(controller.preempt, job_id, notice)
        resumed_at = wait(resumed, f"{controller.name}: resumed ranks of {job_id}")
        reclaim.result()
    document = status(job_id, env)
    detected = min(at(e["at"]) for e in document["events"] if e["kind"] == "PREEMPTED")
    # Cancelled mid-start, a rank would wait out its peers' collective timeout: let it step.
    steps = sum(controller.read(job_id, STEP_LINE).values())
    wait(lambda: sum(controller.read(job_id, STEP_LINE).values()) > steps + 5, "steps again")
    end_job(job_id, env)
    return {
        "submit_to_first_step_s": first - started,
        "recovery_s": resumed_at - detected,
        "submit_command_s": submitted - started,
    }


def cleanup(home: Path, env: dict[str, str], jobs: list[str]) -> list[str]:
    """End whatever the run started, whatever state it is in; returns what went wrong."""
    problems: list[str] = []
    for job_id in jobs:
        try:
            end_job(job_id, env, timeout=90)
        except Exception as exc:  # go on: the steps below end the nodes all the same
            problems.append(f"{job_id}: {exc}")
    record = host_records.load(home)
    if record is not None and record.root:
        # The host's own orch ends its jobs' nodes (`down` of the host ends the host's node).
        try:
            session = HostSession(home, record)
            try:
                session.run(orch_command(HostLayout(record.root), ["down", "--all"]), check=False)
            finally:
                session.close()
        except Exception as exc:
            problems.append(f"orch down --all on the host: {exc}")
    if record is not None:
        down = subprocess.run([*ORCH, "controller", "down", "--force", "--json"], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=180)  # fmt: skip
        if down.returncode != 0:
            problems.append(f"orch controller down: {down.stdout}{down.stderr}"[-1000:])
    subprocess.run([*ORCH, "down", "--all"], env=env, cwd=REPO, capture_output=True, timeout=180)
    left = list((home / "local").glob("nodes/*/node.json"))
    if left:
        problems.append(f"local nodes left: {[p.parent.name for p in left]}")
    return problems


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--notice", type=float, default=10.0, help="reclaim notice (seconds)")
    args = parser.parse_args()
    load_before = load()
    with tempfile.TemporaryDirectory(prefix="orch-bench-host-") as tmp:
        home = Path(tmp) / "orch"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ORCH_")},
            "ORCH_HOME": str(home),
            "PYTHONUNBUFFERED": "1",
        }
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        (workdir / "README").write_text("the reference trainer is installed on every node\n")
        spec = Path(tmp) / "job.yaml"
        spec.write_text(JOB.format(workdir=workdir, nodes=RANKS))
        jobs: list[str] = []
        results: dict[str, list[dict[str, float]]] = {"laptop": [], "host": []}
        try:
            up_started = time.monotonic()
            orch(["controller", "up", "--provider", "local", "--autostop", "0", "--json"], env)
            host_up_s = time.monotonic() - up_started
            print(f"  orch controller up --provider local: {host_up_s:.1f} s", flush=True)
            controllers = [laptop(home, env), host(home)]
            for index in range(args.trials):
                order = controllers if index % 2 == 0 else controllers[::-1]
                for controller in order:  # interleaved: both see the same machine
                    figures = measure(controller, spec, env, args.notice, jobs)
                    results[controller.name].append(figures)
                    print(
                        f"  trial {index} {controller.name:<6}: submit -> first step "
                        f"{figures['submit_to_first_step_s']:.1f} s (`orch submit` returned "
                        f"after {figures['submit_command_s']:.1f} s), recovery "
                        f"{figures['recovery_s']:.1f} s",
                        flush=True,
                    )
        finally:
            problems = cleanup(home, env, jobs)
            for problem in problems:
                print(f"  cleanup: {problem}", file=sys.stderr)
    return report(results, args, host_up_s, load_before, problems)


def report(
    results: dict[str, list[dict[str, float]]],
    args: argparse.Namespace,
    host_up_s: float,
    load_before: list[float],
    problems: list[str],
) -> int:
    load_after = load()
    print(
        f"\ncontroller host overhead, {RANKS} nodes x 1 rank, tiny model, local nodes "
        f"(machine: {machine()}; medians of {args.trials} trials; load average before "
        f"{', '.join(map(str, load_before))}, after {', '.join(map(str, load_after))})"
    )
    summary: dict[str, Any] = {
        "benchmark": "controller_host", "machine": machine(), "trials": args.trials,
        "notice_s": args.notice, "load_before": load_before, "load_after": load_after,
        "host_up_s": round(host_up_s, 2),
    }  # fmt: skip
    names = {"submit_to_first_step_s": "submit -> first step", "recovery_s": "recovery"}
    for key, name in names.items():
        host_values = [r[key] for r in results["host"]]
        laptop_values = [r[key] for r in results["laptop"]]
        ours, base = statistics.median(host_values), statistics.median(laptop_values)
        print(
            f"  {name:<22} host {ours:6.1f} s   laptop {base:6.1f} s   ratio {ours / base:5.2f}"
            f"   (host: {', '.join(f'{v:.1f}' for v in host_values)};"
            f" laptop: {', '.join(f'{v:.1f}' for v in laptop_values)})"
        )
        summary[key] = {
            "host": round(ours, 2), "laptop": round(base, 2), "ratio": round(ours / base, 3),
            "host_trials": [round(v, 2) for v in host_values],
            "laptop_trials": [round(v, 2) for v in laptop_values],
        }  # fmt: skip
    commands = {name: statistics.median(r["submit_command_s"] for r in results[name])
                for name in ("host", "laptop")}  # fmt: skip
    summary["submit_command_s"] = {name: round(v, 2) for name, v in commands.items()}
    print(
        f"  (`orch submit` itself returned after {commands['host']:.1f} s to the host, "
        f"{commands['laptop']:.1f} s on the laptop; recovery: PREEMPTED -> every rank "
        f"restarted, after a {args.notice:g} s notice; `orch controller up`: {host_up_s:.1f} s)"
    )
    print(json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
