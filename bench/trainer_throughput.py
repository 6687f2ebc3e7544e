"""Training throughput of the reference trainer on the CPU: 2 DataLoader workers against 0.

Each measurement is one real `python -m orch_trainer.train` run (world size 1, fake data, no
checkpoints); its throughput is the median of the `img_s` of its progress lines, leaving out
the first window (process start, first batches). Each configuration is repeated (the two
worker settings interleaved) and the median of the repetitions is reported, with the ratio
workers=2 / workers=0 per model: the baseline is measured in the same run, on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(model: str, workers: int, *, steps: int, batch: int, log_every: int) -> float:
    """img/s of one trainer run (median over its progress windows after the first)."""
    argv = [
        sys.executable, "-m", "orch_trainer.train", "--model", model, "--workers", str(workers),
        "--steps", str(steps), "--batch-size", str(batch), "--log-every", str(log_every),
        "--fake-size", str(steps * batch), "--checkpoint-dir", "", "--resume", "none",
        "--checkpoint-seconds", "0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"trainer failed ({result.returncode}): {result.stderr[-2000:]}")
    rates = [
        json.loads(line)["img_s"]
        for line in result.stdout.splitlines()
        if line.startswith('{"step"')
    ]
    if len(rates) < 2:
        raise RuntimeError(f"too few progress lines: {result.stdout}")
    return statistics.median(rates[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    # steps and log interval per model: enough windows to take a median, a few seconds each
    plans = {"tiny": (60, 10), "resnet18": (10, 2)}
    print(
        f"trainer throughput, CPU only ({os.cpu_count()} cores), world size 1, "
        f"batch {args.batch_size}, fake 32x32 data; medians of {args.repeats} runs"
    )
    for model, (steps, log_every) in plans.items():
        runs: dict[int, list[float]] = {0: [], 2: []}
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
            for workers, results in runs.items():
                rate = run_once(
                    model, workers, steps=steps, batch=args.batch_size, log_every=log_every
                )
                results.append(rate)
        medians = {workers: statistics.median(results) for workers, results in runs.items()}
        for workers, results in runs.items():
            shown = ", ".join(f"{r:.1f}" for r in results)
            print(f"  {model:<9} workers={workers}: {medians[workers]:8.1f} img/s  ({shown})")
        print(f"  {model:<9} ratio workers=2 / workers=0: {medians[2] / medians[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
