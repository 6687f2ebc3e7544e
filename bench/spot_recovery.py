"""Spot recovery on local nodes: how fast a notice is seen, saved from, and recovered from,
replacing only the lost node against replacing the whole cluster.

Each trial submits the reference trainer on 4 nodes x 1 rank, with a dataset (`--data-mb`,
512 MB by default) shipped to every node (`data:`, as a real job's shards are), twice: once with
`recovery.replace: lost` (the default: nodes 0, 2 and 3 stay, one node is launched for rank 1)
and once with `recovery.replace: all` (all four replaced), lets it train, then reclaims node 1
with `orch local preempt --notice N` and measures, from the ledger's events and the nodes' logs:

- detection: notice posted -> PREEMPTED event (target <= 5 s);
- salvage: PREEMPTED -> SALVAGED (SIGTERM, emergency checkpoint by rank 0, pull);
- resume: PREEMPTED -> every rank of the restarted run printed its start line, minus the time
  the provider spent launching the new nodes (target <= 20 s); `resume_to_torchrun` stops the
  clock when torchrun is started again (orch's own part, without the trainer's start-up:
  importing torch in every rank);
- recovery: PREEMPTED -> every rank started, launches included (what the user waits);
- recovery cost: what the job's nodes billed between PREEMPTED and that moment, in USD at the
  local price set here (ORCH_LOCAL_PRICE_PER_HOUR);
- no-notice detection (the `lost` job only): a second reclaim without notice -> PREEMPTED
  (missed probe, then the provider confirms).

Baselines, measured in the same trial: the job's cold start on fresh nodes (SYNCING event ->
every rank's start line), what any restart costs without orch's recovery; and the whole
cluster's replacement, against which the lost node's alone must take at most 0.8x the time.

    .venv/bin/python -m bench.spot_recovery [--trials 5] [--notice 10] [--data-mb 512] [--timeline]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import at, machine, wait

REPO = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator.cli"]
RANKS = 4
DATA_MB = 512  # the dataset every node gets: what a whole-cluster replacement sends again
START_LINE = re.compile(r"trainer rank=\d+ world_size=")

PRICE = "2.00"  # USD per node-hour of the local nodes, for the cost of a recovery

JOB = """\
name: spot-bench
workdir: {repo}
run: >-
  python -m orch_trainer.train --model tiny --data fake --fake-size 49152 --epochs 1
  --batch-size 32 --workers 0 --checkpoint-every 10 --log-every 5
data: [{{src: {data}, dst: ~/dataset}}]
resources: {{nodes: 4, gpus_per_node: 1, spot: true}}
checkpoint: {{dir: ~/ckpt, pull_every: 10}}
recovery: {{max_recoveries: 3, replace: {replace}}}
env: {{OMP_NUM_THREADS: "1"}}
"""


def orch(args: list[str], env: dict[str, str]) -> str:
    return subprocess.run(
        [*ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def job(job_id: str, env: dict[str, str]) -> dict:
    return json.loads(orch(["status", job_id, "--json"], env))


def start_lines(home: Path, job_id: str) -> dict[str, int]:
    """Start lines ("trainer rank=R world_size=W", not the exit lines) printed so far in each
    live node's log of the job, read on the nodes' disks, so that waiting costs no `orch`
    process (one `orch status` is about a second of CPU, which a busy poll would take from the
    ranks). A node that stayed through a recovery keeps its log: its lines from before count
    too."""
    counts: dict[str, int] = {}
    for log in home.glob(f"local/nodes/*/disk/orch-jobs/{job_id}/run/node.log"):
        try:
            text = log.read_text(errors="replace")
            counts[log.parents[4].name] = len(START_LINE.findall(text))
        except OSError:
            continue
    return counts


def all_ranks_started(home: Path, job_id: str, before: dict[str, int]) -> bool:
    """Every rank printed a start line since `before` (each node's count then)."""
    now = start_lines(home, job_id)
    return sum(count - before.get(iid, 0) for iid, count in now.items()) >= RANKS


def billed_between(document: dict, start: float, end: float) -> float:
    """USD the job's leases billed between `start` and `end` (epoch seconds)."""
    total = 0.0
    for lease in document["leases"]:
        first = max(start, at(lease["launched_at"]))
        last = min(end, at(lease["ended_at"]) if lease["ended_at"] else end)
        if last > first:
            total += (last - first) * float(lease["price_per_hour"]) / 3600
    return total


def events(document: dict, kind: str) -> list[dict]:
    return [e for e in document["events"] if e["kind"] == kind]


def preempt(job_id: str, env: dict[str, str], notice: float) -> dict:
    """Reclaim node 1; the times it reports are when the notice was posted / the node taken."""
    argv = ["local", "preempt", job_id, "--node", "1", "--notice", f"{notice:g}", "--json"]
    return json.loads(orch(argv, env).strip().splitlines()[-1])


def print_timeline(replace: str, doc: dict, detected: float, resumed_at: float) -> None:
    """The recovery's ledger events, in seconds after PREEMPTED, and when every rank had
    started: where the time of a recovery goes."""
    print(f"  timeline, recovery.replace: {replace}", file=sys.stderr)
    for event in doc["events"]:
        offset = at(event["at"]) - detected
        if 0 <= offset <= resumed_at - detected:
            message = (event.get("message") or "")[:70]
            print(f"    +{offset:6.2f} s  {event['kind']:<13} {message}", file=sys.stderr)
    print(f"    +{resumed_at - detected:6.2f} s  every rank started", file=sys.stderr)


def trial(notice: float, replace: str, data_mb: int, timeline: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="orch-spot-bench-") as tmp:
        home = Path(tmp) / "orch"
        env = {**os.environ, "ORCH_HOME": str(home), "ORCH_LOCAL_PRICE_PER_HOUR": PRICE}
        spec = Path(tmp) / "job.yaml"
        data = Path(tmp) / "dataset"
        data.mkdir()
        for index in range(data_mb // 16):
            (data / f"shard-{index:02d}.bin").write_bytes(os.urandom(16 << 20))
        spec.write_text(JOB.format(repo=REPO, replace=replace, data=data))
        job_id = orch(["submit", str(spec), "--detach"], env).strip().splitlines()[-1]
        try:
            wait(lambda: all_ranks_started(home, job_id, {}), "first ranks")
            started = time.time()
            syncing = at(events(job(job_id, env), "SYNCING")[0]["at"])
            cold = started - syncing
            wait(lambda: (job(job_id, env)["step"] or 0) >= 10, "step 10", every=2)

            # `orch local preempt` returns when the node is taken or let go: the recovery is
            # timed beside it, not after it.
            before = start_lines(home, job_id)
            with ThreadPoolExecutor(1) as background:
                reclaim = background.submit(preempt, job_id, env, notice)
                wait(lambda: all_ranks_started(home, job_id, before), "resumed ranks")
                resumed_at = time.time()
                posted = at(reclaim.result()["notice_posted_at"])
            doc = job(job_id, env)
            detected = at(events(doc, "PREEMPTED")[0]["at"])
            salvaged = at(events(doc, "SALVAGED")[0]["at"])
            provisioning = at(events(doc, "PROVISIONING")[1]["at"])
            launched = max(
                at(e["at"]) for e in events(doc, "LAUNCHED") if at(e["at"]) >= provisioning
            )
            torchrun = at(events(doc, "RUNNING")[1]["at"])
            if timeline:
                print_timeline(replace, doc, detected, resumed_at)
            result = {
                "detection_s": detected - posted,
                "salvage_s": salvaged - detected,
                "resume_s": resumed_at - detected - (launched - provisioning),
                "resume_to_torchrun_s": torchrun - detected - (launched - provisioning),
                "recovery_s": resumed_at - detected,
                "recovery_cost_usd": billed_between(job(job_id, env), detected, resumed_at),
                "provisioning_s": launched - provisioning,
                "cold_start_s": cold,
            }
            if replace == "lost":
                wait(lambda: (job(job_id, env)["step"] or 0) >= 60, "step 60", every=2)
                killed = at(preempt(job_id, env, 0)["reclaimed_at"])
                lost = wait(
                    lambda: events(d := job(job_id, env), "PREEMPTED")[1:] and d, "loss", every=1
                )
                result["no_notice_detection_s"] = at(events(lost, "PREEMPTED")[1]["at"]) - killed
            return result
        finally:
            subprocess.run([*ORCH, "down", "--all"], env=env, cwd=REPO, capture_output=True)


def show(title: str, results: list[dict[str, float]]) -> dict[str, float]:
    med = {key: statistics.median(r[key] for r in results) for key in results[0]}
    print(f"  {title}")
    for key in results[0]:
        values = ", ".join(f"{r[key]:.4f}" if "usd" in key else f"{r[key]:.1f}" for r in results)
        unit = "$" if "usd" in key else "s"
        print(f"    {key:<24} {med[key]:8.4f} {unit}   ({values})")
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)  # noisy machines: a median of 5
    parser.add_argument("--notice", type=float, default=10.0)
    parser.add_argument(
        "--data-mb", type=int, default=DATA_MB, help="the dataset each node gets (MB; 0: none)"
    )
    parser.add_argument(
        "--timeline", action="store_true", help="print each recovery's events on stderr"
    )
    args = parser.parse_args()
    lost: list[dict[str, float]] = []
    whole: list[dict[str, float]] = []
    for _ in range(args.trials):  # interleaved, so that both see the same machine
        lost.append(trial(args.notice, "lost", args.data_mb, args.timeline))
        whole.append(trial(args.notice, "all", args.data_mb, args.timeline))
    print(
        f"\nspot recovery, {RANKS} nodes, a {args.data_mb} MB dataset on each "
        f"(machine: {machine()}; medians of {args.trials} trials)"
    )
    med = show("replacing the lost node alone (recovery.replace: lost)", lost)
    base = show("replacing the whole cluster (recovery.replace: all)", whole)
    ratio = med["resume_s"] / med["cold_start_s"]
    print(
        f"  resume / cold start      orch {med['resume_s']:.1f} s / baseline "
        f"{med['cold_start_s']:.1f} s = ratio {ratio:.2f}"
    )
    partial = med["recovery_s"] / base["recovery_s"]
    print(
        f"  lost node / whole cluster  recovery {med['recovery_s']:.1f} s / "
        f"{base['recovery_s']:.1f} s = ratio {partial:.2f}; cost "
        f"${med['recovery_cost_usd']:.4f} / ${base['recovery_cost_usd']:.4f}"
    )
    ok = med["detection_s"] <= 5.0 and med["resume_s"] <= 20.0 and partial <= 0.8
    print(
        "  targets: detection <= 5 s, resume <= 20 s, lost node / whole cluster <= 0.8: "
        f"{'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
