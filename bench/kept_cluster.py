"""Time to first step: the next job on a kept cluster against the same job on fresh nodes.

The job is what makes iterating slow on fresh nodes: a 50 MB workdir to sync, a `setup` that
takes 10 s (a `pip install` stand-in) and a 2-node torchrun run whose rank 0 prints a first
step at once. Both are the real `orch submit` in the foreground on local nodes, timed from
the command's start to the moment it prints rank 0's first step. The fresh job provisions,
syncs everything and runs setup; the kept one (`--cluster`, a later job on the cluster: its
first job, untimed, made it) launches nothing, syncs only what changed (one edited file) and
skips the unchanged setup. Prints medians and the kept/fresh ratio (target <= 0.3).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median, report  # noqa: E402

SETUP_S = 10
PROBE = "import os\nprint(f'step 1 loss 0.5 rank {os.environ[\"RANK\"]}', flush=True)\n"
FIRST_STEP = "step 1 loss 0.5 rank 0"


def make_workdir(root: Path, megabytes: int) -> Path:
    work = root / "work"
    (work / "data").mkdir(parents=True)
    for index in range(megabytes):
        (work / "data" / f"shard-{index:03d}.bin").write_bytes(os.urandom(1 << 20))
    (work / "probe.py").write_text(PROBE)
    return work


def write_spec(root: Path) -> Path:
    spec = root / "job.yaml"
    spec.write_text(
        "name: iterate\nworkdir: work\nresources: {nodes: 2, gpus_per_node: 1}\n"
        f"setup: sleep {SETUP_S}\nrun: python probe.py\n"
    )
    return spec


def time_to_first_step(args: list[str], env: dict[str, str]) -> float:
    """Seconds from `orch submit` starting to it printing rank 0's first step; the job must
    then succeed."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "submit", *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: float | None = None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if seen is None and FIRST_STEP in line:
            seen = time.perf_counter() - start
    if proc.wait(timeout=300) != 0 or seen is None:
        raise RuntimeError("the job did not succeed:\n" + "".join(lines[-30:]))
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir-mb", type=int, default=50)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-kept-") as tmp:
        root = Path(tmp)
        work = make_workdir(root, options.workdir_mb)
        spec = write_spec(root)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ORCH_")},
            "ORCH_HOME": str(root / "orch"),
            "ORCH_WATCH_INTERVAL": "1",
            "PYTHONUNBUFFERED": "1",
        }
        kept_args = [str(spec), "--cluster", "bench", "--autostop", "10m"]
        fresh, kept = [], []
        try:
            time_to_first_step(kept_args, env)  # the cluster's first job: launches it
            for rep in range(options.repeats):
                (work / "probe.py").write_text(PROBE + f"# edit {rep}\n")  # one changed file
                fresh.append(time_to_first_step([str(spec)], env))
                kept.append(time_to_first_step(kept_args, env))
                print(f"  rep {rep}: fresh {fresh[-1]:.2f} s, kept {kept[-1]:.2f} s", flush=True)
        finally:
            subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "down", "--all"], env=env,
                capture_output=True, check=False,
            )  # fmt: skip
    ok = report(
        f"Time to first step, {options.workdir_mb} MB workdir, {SETUP_S} s setup, 2 nodes",
        [("next job on a kept cluster", median(kept), median(fresh))],
        target=0.3,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
