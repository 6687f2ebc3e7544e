"""Spot recovery on local nodes: how fast a notice is seen, saved from, and recovered from.

Each trial submits the reference trainer on 2 nodes x 2 ranks (spot, default controller
settings: nodes poll for notices every 5 s), lets it train, then reclaims node 1 with
`orch local preempt --notice N` and measures, from the ledger's events and the new nodes' logs:

- detection: notice posted -> PREEMPTED event (target <= 5 s);
- salvage: PREEMPTED -> SALVAGED (SIGTERM, emergency checkpoint by rank 0, pull);
- resume: PREEMPTED -> every rank of the new nodes printed its start line, minus the time the
  provider spent launching the new nodes (target <= 20 s); `resume_to_torchrun` stops the
  clock when torchrun is started on the new nodes (orch's own part, without the trainer's
  start-up: importing torch in every rank);
- no-notice detection: a second reclaim without notice -> PREEMPTED (missed probe, then the
  provider confirms).

Baseline, measured in the same trial: the job's cold start on fresh nodes (SYNCING event ->
every rank's start line), which is what any restart costs without orch's recovery. The ratio
resume / cold start says what recovery adds on top (salvage, teardown, checkpoint push).

    .venv/bin/python -m bench.spot_recovery [--trials 3] [--notice 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from bench.common import machine

REPO = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator.cli"]
RANKS = 4

JOB = """\
name: spot-bench
workdir: {repo}
run: >-
  python -m orch_trainer.train --model tiny --data fake --fake-size 49152 --epochs 1
  --batch-size 32 --workers 0 --checkpoint-every 10 --log-every 5
resources: {{nodes: 2, gpus_per_node: 2, spot: true}}
checkpoint: {{dir: ~/ckpt, pull_every: 10}}
recovery: {{max_recoveries: 3}}
env: {{OMP_NUM_THREADS: "1"}}
"""


def orch(args: list[str], env: dict[str, str]) -> str:
    return subprocess.run(
        [*ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def job(job_id: str, env: dict[str, str]) -> dict:
    return json.loads(orch(["status", job_id, "--json"], env))


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def wait(predicate, what: str, timeout: float = 300, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


def started_nodes(home: Path, job_id: str, old: frozenset[str] = frozenset()) -> list[str]:
    """Nodes not in `old` on which every rank of the job printed its start line, once all
    RANKS have (else []): read on the nodes' disks, so that waiting costs no `orch` process
    (one `orch status` is about a second of CPU, which a busy poll would take from the ranks)."""
    seen, nodes = 0, []
    for log in home.glob(f"local/nodes/*/disk/orch-jobs/{job_id}/run/node.log"):
        iid = log.parents[4].name
        if iid in old:
            continue
        try:
            seen += log.read_text(errors="replace").count("trainer rank=")
        except OSError:
            continue
        nodes.append(iid)
    return nodes if seen >= RANKS else []


def events(document: dict, kind: str) -> list[dict]:
    return [e for e in document["events"] if e["kind"] == kind]


def preempt(job_id: str, env: dict[str, str], notice: float) -> dict:
    """Reclaim node 1; the times it reports are when the notice was posted / the node taken."""
    argv = ["local", "preempt", job_id, "--node", "1", "--notice", f"{notice:g}", "--json"]
    return json.loads(orch(argv, env).strip().splitlines()[-1])


def trial(notice: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="orch-spot-bench-") as tmp:
        home = Path(tmp) / "orch"
        env = {**os.environ, "ORCH_HOME": str(home)}
        spec = Path(tmp) / "job.yaml"
        spec.write_text(JOB.format(repo=REPO))
        job_id = orch(["submit", str(spec), "--detach"], env).strip().splitlines()[-1]
        try:
            first = wait(lambda: started_nodes(home, job_id), "first ranks")
            started = time.time()
            syncing = at(events(job(job_id, env), "SYNCING")[0]["at"])
            cold = started - syncing
            wait(lambda: (job(job_id, env)["step"] or 0) >= 10, "step 10", every=2)

            # `orch local preempt` returns when the node is taken or let go: the recovery is
            # timed beside it, not after it.
            with ThreadPoolExecutor(1) as background:
                reclaim = background.submit(preempt, job_id, env, notice)
                wait(lambda: started_nodes(home, job_id, frozenset(first)), "resumed ranks")
                resumed_at = time.time()
                posted = at(reclaim.result()["notice_posted_at"])
            doc = job(job_id, env)
            detected = at(events(doc, "PREEMPTED")[0]["at"])
            salvaged = at(events(doc, "SALVAGED")[0]["at"])
            provisioning = at(events(doc, "PROVISIONING")[1]["at"])
            launched = max(at(e["at"]) for e in events(doc, "LAUNCHED")[2:4])
            torchrun = at(events(doc, "RUNNING")[1]["at"])

            wait(lambda: (job(job_id, env)["step"] or 0) >= 60, "step 60", every=2)
            killed = at(preempt(job_id, env, 0)["reclaimed_at"])
            lost = wait(
                lambda: events(d := job(job_id, env), "PREEMPTED")[1:] and d, "loss", every=1
            )
            lost_detected = at(events(lost, "PREEMPTED")[1]["at"])
            return {
                "detection_s": detected - posted,
                "salvage_s": salvaged - detected,
                "resume_s": resumed_at - detected - (launched - provisioning),
                "resume_to_torchrun_s": torchrun - detected - (launched - provisioning),
                "provisioning_s": launched - provisioning,
                "cold_start_s": cold,
                "no_notice_detection_s": lost_detected - killed,
            }
        finally:
            subprocess.run([*ORCH, "down", "--all"], env=env, cwd=REPO, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--notice", type=float, default=30.0)
    args = parser.parse_args()
    results = [trial(args.notice) for _ in range(args.trials)]
    med = {key: statistics.median(r[key] for r in results) for key in results[0]}
    print(f"\nspot recovery (machine: {machine()}; medians of {args.trials} trials)")
    for key in results[0]:
        values = ", ".join(f"{r[key]:.1f}" for r in results)
        print(f"  {key:<24} {med[key]:6.1f} s   ({values})")
    ratio = med["resume_s"] / med["cold_start_s"]
    print(
        f"  resume / cold start      orch {med['resume_s']:.1f} s / baseline "
        f"{med['cold_start_s']:.1f} s = ratio {ratio:.2f}"
    )
    ok = med["detection_s"] <= 5.0 and med["resume_s"] <= 20.0
    print(f"  targets: detection <= 5 s, resume <= 20 s: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
