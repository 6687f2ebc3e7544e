"""Start-up time of the command line: `orch --help`, and `orch status` / `orch cost` on a ledger
of 100 finished jobs, against the floor any typer + rich command pays (the interpreter
importing typer and rich.console), measured in the same run.

Each command runs as a new process, as a user's shell starts it, `--repeats` times; medians.
Targets: `orch --help` <= 0.3 s, `orch status` and `orch cost` on 100 jobs <= 0.5 s.

    .venv/bin/python -m bench.cli_startup [--repeats 7] [--jobs 100]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, median  # noqa: E402
from orchestrator.config import Settings  # noqa: E402
from orchestrator.job_state import JobState  # noqa: E402
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine, utcnow  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ORCH = Path(sys.executable).parent / "orch"
TARGETS_S = {"orch --help": 0.3, "orch status": 0.5, "orch cost": 0.5}


def fill_ledger(home: Path, jobs: int) -> None:
    """`jobs` finished two-node jobs, each with its leases and a handful of events."""
    ledger = Ledger(make_engine(Settings(home=home).db_path))
    start = utcnow() - timedelta(days=3)
    for n in range(jobs):
        created = start + timedelta(minutes=30 * n)
        job_id = f"bench-startup-{n:04d}"
        ledger.add_job(
            Job(
                id=job_id, name="bench-startup", state=JobState.SUCCEEDED, provider="local",
                nodes=2, gpus_per_node=2, spec_json="{}", spec_path="job.yaml",
                created_at=created, started_at=created + timedelta(seconds=20),
                ended_at=created + timedelta(minutes=20), step=480, exit_code=0,
            )
        )  # fmt: skip
        for rank in range(2):
            ledger.open_lease(
                Lease(
                    job_id=job_id, cluster=job_id, provider="local",
                    instance_id=f"local-{n:04d}-{rank}", rank=rank, market="on-demand",
                    instance_type="local", price_per_hour=Decimal("0.50"),
                    launched_at=created + timedelta(seconds=5),
                    ended_at=created + timedelta(minutes=20),
                )
            )  # fmt: skip
        for kind in ("PROVISIONING", "SYNCING", "RUNNING", "STOPPING", "SUCCEEDED"):
            ledger.add_event(job_id, kind, "")


def time_command(argv: list[str], env: dict[str, str], repeats: int) -> float:
    """Median wall time of `argv` as a fresh process; it must exit 0."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-startup-") as home:
        fill_ledger(Path(home), args.jobs)
        env = {**os.environ, "ORCH_HOME": home, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
        floor = time_command(
            [sys.executable, "-c", "import typer, rich.console"], env, args.repeats
        )
        rows = [
            ("orch --help", [str(ORCH), "--help"]),
            ("orch --version", [str(ORCH), "--version"]),
            ("orch status", [str(ORCH), "status"]),
            ("orch status --json", [str(ORCH), "status", "--json"]),
            ("orch cost", [str(ORCH), "cost"]),
        ]
        print(
            f"\nCommand start-up, {args.jobs} jobs in the ledger  (machine: {machine()}; "
            f"medians of {args.repeats}; baseline: python -c 'import typer, rich.console' "
            f"{floor:.3f} s)"
        )
        ok = True
        for name, argv in rows:
            seconds = time_command(argv, env, args.repeats)
            target = TARGETS_S.get(name)
            verdict = ""
            if target is not None:
                met = seconds <= target
                ok &= met
                verdict = f"   target <= {target} s: {'met' if met else 'NOT met'}"
            print(
                f"  {name:<20} {seconds:6.3f} s   baseline {floor:6.3f} s   "
                f"ratio {seconds / floor:5.2f}{verdict}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
