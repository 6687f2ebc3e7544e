"""Capture rate of a checkpoint rewritten in place on a busy node: how many of its saves the
node's checkpoint agent takes a copy of.

A writer process `torch.save`s a model (`--mb` MB) in place every 0.5 s, 1 s and 2 s (as
Lightning rewrites `last.ckpt` every epoch), while `--burners` other processes (1 by default)
keep a core each busy at the writer's priority (training on the node), for `--seconds` per
rate. Two agents watch
the same directory at the same time, each the program orch ships to nodes, started as orch
starts it (it lowers its own priority): the agent as it is (a zip is copied at the first look
where it is a finished write), and the baseline, the same agent with that switched off
(`take_at_look: false`: the quiet rule alone, a file taken only once unchanged for 1 s, as
before). The figure is the share of saves a copy was taken of (read from the agents'
manifests, as the controller reads them); every copy is checked to be exactly one save.

    .venv/bin/python -m bench.checkpoint_capture [--repeats 3] [--seconds 30] [--mb 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import machine  # noqa: E402
from orchestrator.node import runtime  # noqa: E402

RATES_S = (0.5, 1.0, 2.0)
TARGETS = {0.5: ">= 0.3", 1.0: ">= 0.5", 2.0: ">= 0.8"}  # share of saves captured
NAME = "last.ckpt"

WRITER = r"""
import hashlib, sys, time
import torch
path, log = sys.argv[1], sys.argv[2]
every, mb, seconds = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
torch.set_num_threads(1)
state = {"model": {"w": torch.zeros(mb * 1024 * 1024 // 4)}, "epoch": 0}
ends = time.monotonic() + seconds
with open(log, "a") as out:
    while time.monotonic() < ends:
        started = time.monotonic()
        state["epoch"] += 1
        state["model"]["w"][0] = state["epoch"]
        torch.save(state, path)  # in place, as Lightning's last.ckpt
        with open(path, "rb") as handle:
            out.write(hashlib.blake2b(handle.read(), digest_size=32).hexdigest() + "\n")
        out.flush()
        time.sleep(max(0.0, every - (time.monotonic() - started)))
"""

BURNER = "while True: pass"


class Follower(threading.Thread):
    """Reads an agent's manifest each time it writes one (its events file grows), as the
    controller does, and keeps the digests of the copies it staged of the checkpoint."""

    def __init__(self, state: Path) -> None:
        super().__init__(daemon=True)
        self.state = state
        self.staged: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        size = -1
        while not self.stop.wait(0.01):
            try:
                now = (self.state / "events").stat().st_size
                if now == size:
                    continue
                size = now
                manifest = json.loads((self.state / "manifest.json").read_text())
            except (OSError, ValueError):
                continue
            staged = (manifest.get("files", {}).get(NAME) or {}).get("staged")
            if staged:
                self.staged.add(staged["digest"])


def start_agent(program: Path, root: Path, label: str, *, take_at_look: bool) -> tuple:
    state = root / f"state-{label}"
    run = root / "run"
    state.mkdir()
    config = {
        "job_id": "bench", "rank": 0, "checkpoint_dir": str(root / "ckpt"),
        "run_dir": str(run), "state_dir": str(state), "exclude": [], "store": None,
        "restored": {}, "take_at_look": take_at_look,
    }  # fmt: skip
    (state / "config.json").write_text(json.dumps(config))
    process = subprocess.Popen(
        [sys.executable, str(program), "checkpoint-agent", "watch", "--config",
         str(state / "config.json")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    follower = Follower(state)
    follower.start()
    return process, follower


def trial(every: float, seconds: float, mb: int, burners: int) -> dict[str, tuple[int, int, int]]:
    """One rate: {agent: (saves, captured, not a save)}."""
    with tempfile.TemporaryDirectory(prefix="orch-capture-bench-") as tmp:
        root = Path(tmp)
        program = root / runtime.file_name()  # the node runtime, as on a node
        program.write_bytes(runtime.build())
        (root / "ckpt").mkdir()
        (root / "run").mkdir()
        sleeper = subprocess.Popen(["sleep", str(seconds + 60)])  # the run the agents watch
        (root / "run" / "pid").write_text(str(sleeper.pid))
        busy = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(burners)]
        agents = {
            "orch": start_agent(program, root, "orch", take_at_look=True),
            "quiet rule": start_agent(program, root, "quiet", take_at_look=False),
        }
        log = root / "saves.log"
        try:
            time.sleep(1.0)  # the agents' first look (their baseline) before the first save
            subprocess.run(
                [sys.executable, "-c", WRITER, str(root / "ckpt" / NAME), str(log),
                 str(every), str(mb), str(seconds)],
                check=True,
            )  # fmt: skip
            time.sleep(1.0)  # the last save's look
        finally:
            for process, follower in agents.values():
                follower.stop.set()
                process.kill()
                process.wait()
            for process in [*busy, sleeper]:
                process.kill()
                process.wait()
        saves = set(log.read_text().split())
        return {
            label: (len(saves), len(follower.staged & saves), len(follower.staged - saves))
            for label, (_process, follower) in agents.items()
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--mb", type=int, default=16)
    parser.add_argument("--burners", type=int, default=1)
    args = parser.parse_args()
    shares: dict[float, dict[str, list[float]]] = {
        r: {"orch": [], "quiet rule": []} for r in RATES_S
    }
    torn = 0
    for repeat in range(args.repeats):
        for every in RATES_S:
            result = trial(every, args.seconds, args.mb, args.burners)
            parts = []
            for label, (saves, captured, other) in result.items():
                shares[every][label].append(captured / saves if saves else 0.0)
                torn += other
                parts.append(f"{label} {captured}/{saves}")
            print(f"  rep {repeat}: every {every:g} s: {', '.join(parts)}", flush=True)
    print(f"  copies that were no save (torn or mixed): {torn}")
    print(
        f"\ncheckpoint capture on a busy node ({args.mb} MB torch.save in place, "
        f"{args.burners} other process(es) loading the CPU, {args.seconds:g} s per rate; "
        f"machine: {machine()}; medians of {args.repeats})"
    )
    ok = torn == 0
    for every in RATES_S:
        ours = statistics.median(shares[every]["orch"])
        base = statistics.median(shares[every]["quiet rule"])
        ratio = f"{ours / base:5.2f}" if base else "    -"
        target = TARGETS[every]
        ok &= ours >= float(target.split()[1])
        print(f"  saves captured, rewritten every {every:g} s    orch {ours:9.3f} share    "
              f"baseline {base:9.3f} share    (the quiet rule alone: take_at_look off)  "
              f"ratio {ratio}  target {target}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
