"""Team-scale figures: a shared PostgreSQL ledger against a shared SQLite file, in the same run.

What it measures (every figure a median; each baseline measured in the same run):

1. Concurrent submits: 16 detached one-node jobs (`orch submit job.yaml --detach`, local
   provider, `launcher: none`, a short loop printing progress) submitted at once from 2
   ORCH_HOMEs that share one ledger: first a PostgreSQL database (a throwaway server started
   with initdb/pg_ctl on 127.0.0.1), then, as the baseline, one SQLite file both homes name
   with `ledger.url: sqlite:///...`. Reported: wall time from the first submit to the last job
   final, and failures: a job not SUCCEEDED, a controller log mentioning a lock error
   ("database is locked", OperationalError, deadlock), a job whose state events are not the
   whole PROVISIONING SYNCING RUNNING STOPPING SUCCEEDED sequence, or a lease left open.
   Target: no failure on either ledger.
2. Read commands on a big ledger: `orch status`, `orch status --json`, `orch cost` and
   `orch cost --json`, each a new process as a user's shell starts it, over a ledger of 10,000
   jobs (seeded with direct inserts through the SQLModel tables: a mix of final states, a few
   running, leases with recoveries, events and checkpoints, spread over six months), on
   SQLite and on PostgreSQL. Baseline: `orch --help` (the process start). Target: <= 1 s.
3. Controller CPU per watched node: one detached job of N local nodes (8, 32, 64) running a
   cheap shell loop, the controller's CPU time (its own and its waited children's, psutil)
   over a fixed window of steady RUNNING, divided by N, as % of one core. Baseline: the
   figure at the smallest N, so the ratio is how the per-node cost grows. Target: < 3 % per
   node at every N.

    .venv/bin/python -m bench.team_scale [--quick] [--only submit,reads,cpu] [--repeats 5]

`--quick` runs fewer repetitions (3 command runs, a 20 s CPU window, 5,000 jobs seeded for
the reads). The PostgreSQL server binaries (Debian's `postgresql`) must be installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, median  # noqa: E402
from bench.team_seed import Seed, seed_rows, write_seed  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ORCH = Path(sys.executable).parent / "orch"

SUBMIT_JOBS = 16
HOMES = 2
READS_TARGET_S = 1.0
CPU_TARGET_PCT = 3.0
EXPECTED_STATES = ("PROVISIONING", "SYNCING", "RUNNING", "STOPPING", "SUCCEEDED")
LOCK_ERRORS = re.compile(r"database is locked|OperationalError|deadlock", re.IGNORECASE)
STATE_KINDS = frozenset(
    ("PENDING", "PROVISIONING", "SYNCING", "RUNNING", "RECOVERING", "SWITCHING", "WAITING",
     "STOPPING", "SUCCEEDED", "FAILED", "CANCELLED", "IDLE_STOPPED", "TIMED_OUT",
     "BUDGET_STOPPED")
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Pure helpers: the CPU arithmetic (the seeded ledger is bench/team_seed.py)


def per_node_pct(cpu_seconds: float, window_s: float, nodes: int) -> float:
    """CPU seconds spent over `window_s` of wall time, per node, as % of one core."""
    if window_s <= 0 or nodes <= 0:
        raise ValueError("the window and the node count must be positive")
    return cpu_seconds / window_s / nodes * 100


def growth(per_node: dict[int, float]) -> str:
    """How the per-node figure grows with N, in words: the ratio of the largest N's figure
    to the smallest's."""
    ns = sorted(per_node)
    if len(ns) < 2 or per_node[ns[0]] <= 0:
        return "one size only"
    ratio = per_node[ns[-1]] / per_node[ns[0]]
    scale = ns[-1] / ns[0]
    if ratio < 0.77:
        kind = "falls with N"
    elif ratio < 1.3:
        kind = "flat"
    else:
        kind = "grows with N" if ratio < scale else "grows faster than N"
    return f"x{ratio:.2f} from {ns[0]} to {ns[-1]} nodes (x{scale:g} nodes): {kind}"


def state_sequence(kinds: Iterable[str]) -> list[str]:
    """The job-state events among a job's event kinds, in order."""
    return [kind for kind in kinds if kind in STATE_KINDS]


# --------------------------------------------------------------------------------------------
# Printing


def row(
    name: str,
    value: float,
    unit: str,
    baseline: float | None,
    baseline_name: str,
    target: str,
    met: bool | None,
) -> str:
    """One figure line: the value, its baseline and ratio, and the target's verdict."""
    base = (
        f"baseline {baseline:9.3f} {unit} ({baseline_name})   ratio {value / baseline:6.2f}"
        if baseline
        else "baseline - ratio -"
    )
    verdict = "-" if met is None else ("met" if met else "NOT met")
    return f"  {name:<44} {value:9.3f} {unit}   {base}   target {target}: {verdict}"


# --------------------------------------------------------------------------------------------
# Environments


def orch_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_HOME": str(home), "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "160"})
    env.update(extra)
    return env


def make_home(root: Path, name: str, url: str | None) -> Path:
    home = root / name
    home.mkdir(parents=True)
    if url:
        (home / "config.yaml").write_text(f"ledger:\n  url: {url}\n")
    return home


def orch(args: Sequence[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ORCH), *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        **kwargs,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# 1. Concurrent submits


@dataclass
class SubmitResult:
    wall_s: float
    failures: list[str]


def submit_round(root: Path, url: str, label: str, steps: int) -> SubmitResult:
    """16 detached jobs from 2 homes on the ledger at `url`, at once; waits for all to end."""
    from sqlalchemy import text

    from orchestrator.ledger.store import make_engine

    work = root / f"{label}-work"
    work.mkdir()
    spec = root / f"{label}-job.yaml"
    spec.write_text(
        f"name: team-{label}\nworkdir: {work}\nlauncher: none\n"
        f'run: for i in $(seq 1 {steps}); do echo "step $i loss 0.5"; sleep 0.5; done\n'
        "resources: {nodes: 1, gpus_per_node: 1}\n"
    )
    homes = [make_home(root, f"{label}-home{h}", url) for h in range(HOMES)]
    envs = [orch_env(home, ORCH_WATCH_INTERVAL="1") for home in homes]
    failures: list[str] = []
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [str(ORCH), "submit", str(spec), "--detach"],
            env=envs[i % HOMES],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        for i in range(SUBMIT_JOBS)
    ]
    job_home: dict[str, Path] = {}
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failures.append(f"submit {i} exited {proc.returncode}: {err.strip()[-300:]}")
            continue
        job_home[out.split()[-1]] = homes[i % HOMES]
    engine = make_engine(url)
    deadline = time.monotonic() + 600
    final = set(STATE_KINDS) - {
        "PENDING", "PROVISIONING", "SYNCING", "RUNNING", "RECOVERING", "SWITCHING", "WAITING",
        "STOPPING",
    }  # fmt: skip
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            states = dict(connection.execute(text("SELECT id, state FROM job")).all())
        if job_home and all(states.get(job) in final for job in job_home):
            break
        time.sleep(0.5)
    wall = time.perf_counter() - started
    with engine.connect() as connection:
        events = connection.execute(text("SELECT job_id, kind FROM event ORDER BY id")).all()
        open_leases = connection.execute(
            text("SELECT job_id FROM lease WHERE ended_at IS NULL")
        ).all()
    engine.dispose()
    kinds: dict[str, list[str]] = {}
    for job_id, kind in events:
        kinds.setdefault(job_id, []).append(kind)
    for job_id, home in sorted(job_home.items()):
        if states.get(job_id) != "SUCCEEDED":
            failures.append(f"{job_id}: {states.get(job_id)}")
        sequence = state_sequence(kinds.get(job_id, []))
        if tuple(sequence) != EXPECTED_STATES:
            failures.append(f"{job_id}: state events {' '.join(sequence)}")
        if not (home / "jobs" / job_id / "controller.log").exists():
            failures.append(f"{job_id}: no controller.log to look for lock errors in")
        for log in (home / "jobs" / job_id).rglob("*.log"):
            text_ = log.read_text(errors="replace")
            if found := LOCK_ERRORS.search(text_):
                failures.append(f"{job_id}: {log.name} mentions {found.group(0)!r}")
    for (job_id,) in open_leases:
        if job_id in job_home:
            failures.append(f"{job_id}: a lease left open")
    return SubmitResult(wall, failures)


# --------------------------------------------------------------------------------------------
# 2. Read commands on a big ledger


READ_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("status",),
    ("status", "--json"),
    ("cost",),
    ("cost", "--json"),
    ("status", "--json", "--limit", "20"),  # a page for scripts
    ("cost", "--json", "--since", "7d"),
)


def read_commands(count: int) -> tuple[tuple[str, ...], ...]:
    """`READ_COMMANDS` and one job's view (the newest of `count` seeded jobs)."""
    newest = f"seed-{count - 1:06d}"
    return (*READ_COMMANDS, ("status", newest), ("status", newest, "--json"))


def time_command(args: Sequence[str], env: dict[str, str], repeats: int) -> tuple[float, str]:
    """Median wall time of `orch args` as a new process, and its last output; it must exit 0."""
    seconds = []
    out = ""
    for _ in range(repeats):
        started = time.perf_counter()
        done = orch(args, env)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(
                f"orch {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
            )
        out = done.stdout
    return median(seconds), out


def check_reads(outputs: dict[tuple[str, ...], str], count: int) -> list[str]:
    """What is wrong with the documents the read commands printed over `count` seeded jobs."""
    problems = []
    status = json.loads(outputs[("status", "--json")])
    if not status["jobs"] or status["jobs"][0]["id"] != f"seed-{count - 1:06d}":
        problems.append("orch status --json does not start with the newest job")
    cost = json.loads(outputs[("cost", "--json")])
    if len(cost["jobs"]) != count:
        problems.append(f"orch cost --json lists {len(cost['jobs'])} jobs, not {count}")
    page = json.loads(outputs[("status", "--json", "--limit", "20")])["jobs"]
    if [job["id"] for job in page] != [job["id"] for job in status["jobs"][:20]]:
        problems.append("orch status --json --limit 20 is not the newest 20 jobs")
    newest = json.loads(outputs[("status", f"seed-{count - 1:06d}", "--json")])
    if newest.get("id") != f"seed-{count - 1:06d}":
        problems.append("orch status JOB --json does not show that job")
    return problems


def reads_round(root: Path, url: str | None, label: str, rows: Seed, repeats: int) -> dict:
    """Seed the ledger (`url`, or the SQLite file of a new home), then time the commands."""
    from orchestrator.ledger.store import make_engine

    home = make_home(root, f"{label}-reads", url)
    engine = make_engine(url or home / "orch.db")
    started = time.perf_counter()
    write_seed(engine, rows)
    engine.dispose()
    seeded = time.perf_counter() - started
    env = orch_env(home)
    baseline, _ = time_command(["--help"], env, repeats)
    figures: dict[tuple[str, ...], float] = {}
    outputs: dict[tuple[str, ...], str] = {}
    for args in read_commands(len(rows.jobs)):
        figures[args], outputs[args] = time_command(args, env, repeats)
    return {
        "baseline": baseline,
        "figures": figures,
        "seeded_s": seeded,
        "problems": check_reads(outputs, len(rows.jobs)),
    }


# --------------------------------------------------------------------------------------------
# 3. Controller CPU per node


def controller_cpu(root: Path, nodes: int, window_s: float, interval: float) -> float:
    """% of one core per node the detached controller of one N-node job spends over
    `window_s` of steady RUNNING (after a settling pause)."""
    import psutil

    home = make_home(root, f"cpu-{nodes}", None)
    work = root / f"cpu-{nodes}-work"
    work.mkdir()
    spec = root / f"cpu-{nodes}.yaml"
    spec.write_text(
        f"name: cpu-{nodes}\nworkdir: {work}\nlauncher: none\n"
        'run: i=0; while true; do i=$((i+1)); echo "step $i loss 0.5"; sleep 2; done\n'
        f"resources: {{nodes: {nodes}, gpus_per_node: 1}}\n"
    )
    env = orch_env(home, ORCH_WATCH_INTERVAL=str(interval))
    submitted = orch(["submit", str(spec), "--detach"], env, timeout=600)
    if submitted.returncode != 0:
        raise RuntimeError(
            f"{nodes} nodes: submit exited {submitted.returncode}: {submitted.stderr[-1500:]}"
        )
    job_id = submitted.stdout.split()[-1]
    try:
        deadline = time.monotonic() + 600
        while True:
            state = json.loads(orch(["status", job_id, "--json"], env).stdout)["state"]
            if state == "RUNNING":
                break
            if state not in ("PENDING", "PROVISIONING", "SYNCING") or time.monotonic() > deadline:
                raise RuntimeError(f"{nodes} nodes: the job is {state}, not RUNNING")
            time.sleep(1)
        time.sleep(max(10.0, 2 * interval))  # past the first checks after the start
        process = psutil.Process(int((home / "jobs" / job_id / "controller.pid").read_text()))
        before, start = _cpu(process), time.monotonic()
        time.sleep(window_s)
        spent, window = _cpu(process) - before, time.monotonic() - start
        state = json.loads(orch(["status", job_id, "--json"], env).stdout)["state"]
        if state != "RUNNING":
            raise RuntimeError(f"{nodes} nodes: the job left RUNNING during the window: {state}")
    finally:
        orch(["cancel", job_id], env, timeout=600)
    return per_node_pct(spent, window, nodes)


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


# --------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (see above)")
    parser.add_argument("--only", default="submit,reads,cpu", help="comma-separated parts")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each command [5]")
    parser.add_argument("--jobs", type=int, default=None, help="jobs seeded for reads [10000]")
    parser.add_argument("--submit-rounds", type=int, default=None, help="per ledger [2]")
    parser.add_argument("--steps", type=int, default=10, help="progress lines of a submitted job")
    parser.add_argument("--nodes", default="8,32,64", help="node counts of the CPU part")
    parser.add_argument("--window", type=float, default=None, help="CPU window, s [60]")
    parser.add_argument("--interval", type=float, default=5.0, help="watch interval, s")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    repeats = args.repeats or (3 if args.quick else 5)
    jobs = args.jobs or (5000 if args.quick else 10000)
    rounds = args.submit_rounds or (1 if args.quick else 2)
    window = args.window or (20.0 if args.quick else 60.0)

    from tests.support.postgres import start_server

    lines: list[str] = []
    ok = True
    server = start_server()
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-team-") as tmp:
            root = Path(tmp)
            if "submit" in parts:
                walls: dict[str, list[float]] = {"postgresql": [], "sqlite": []}
                failures: dict[str, list[str]] = {"postgresql": [], "sqlite": []}
                for r in range(rounds):
                    order = ("postgresql", "sqlite") if r % 2 == 0 else ("sqlite", "postgresql")
                    for kind in order:  # alternated: neither always runs on a warmer machine
                        url = (
                            server.fresh_database("team")
                            if kind == "postgresql"
                            else f"sqlite:///{root / f'shared-{r}.db'}"
                        )
                        done = submit_round(root, url, f"{kind}-{r}", args.steps)
                        walls[kind].append(done.wall_s)
                        failures[kind] += done.failures
                        print(
                            f"  round {r} {kind}: {done.wall_s:.1f} s, "
                            f"{len(done.failures)} failure(s)",
                            flush=True,
                        )
                        for failure in done.failures[:10]:
                            print(f"    {failure}", flush=True)
                pg, lite = median(walls["postgresql"]), median(walls["sqlite"])
                met = not failures["postgresql"] and not failures["sqlite"]
                ok &= met
                lines.append(
                    row(
                        f"{SUBMIT_JOBS} detached jobs from {HOMES} homes, wall",
                        pg,
                        "s",
                        lite,
                        "the same on one shared SQLite file",
                        "0 failures",
                        met,
                    )  # fmt: skip
                )
                lines.append(
                    f"  failures: postgresql {len(failures['postgresql'])}, "
                    f"sqlite {len(failures['sqlite'])} (over {rounds} round(s) of "
                    f"{SUBMIT_JOBS} jobs each)"
                )
            if "reads" in parts:
                rows = seed_rows(jobs, datetime.now().astimezone())
                for kind in ("sqlite", "postgresql"):
                    url = server.fresh_database("reads") if kind == "postgresql" else None
                    done = reads_round(root, url, kind, rows, repeats)
                    print(f"  seeded {jobs} jobs on {kind} in {done['seeded_s']:.1f} s", flush=True)
                    for problem in done["problems"]:
                        ok = False
                        print(f"    {kind}: {problem}", flush=True)
                    for command, seconds in done["figures"].items():
                        met = seconds <= READS_TARGET_S
                        ok &= met
                        lines.append(
                            row(
                                f"orch {' '.join(command)}, {jobs} jobs, {kind}",
                                seconds,
                                "s",
                                done["baseline"],
                                "orch --help",
                                f"<= {READS_TARGET_S:g} s",
                                met,
                            )  # fmt: skip
                        )
            if "cpu" in parts:
                per_node: dict[int, float] = {}
                for nodes in (int(n) for n in args.nodes.split(",")):
                    try:
                        per_node[nodes] = controller_cpu(root, nodes, window, args.interval)
                        print(f"  {nodes} nodes: {per_node[nodes]:.2f} % per node", flush=True)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        ok = False
                        print(f"  {nodes} nodes did not run: {exc}", flush=True)
                if per_node:
                    smallest = min(per_node)
                    for nodes, pct in sorted(per_node.items()):
                        met = pct < CPU_TARGET_PCT
                        ok &= met
                        lines.append(
                            row(
                                f"controller CPU per node, {nodes} nodes",
                                pct,
                                "%",
                                per_node[smallest],
                                f"per node at {smallest} nodes",
                                f"< {CPU_TARGET_PCT:g} %",
                                met,
                            )  # fmt: skip
                        )
                    lines.append(f"  per-node growth: {growth(per_node)}")
    finally:
        server.stop()
    print(
        f"\nteam scale (machine: {machine()}; medians of {repeats} command runs, "
        f"{rounds} submit round(s), {window:g} s CPU windows; PostgreSQL and SQLite in the "
        "same run)"
    )
    for line in lines:
        print(line)
    print(f"  targets: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
