"""A checkpoint agent run in the test's own process, on real directories under `tmp_path`."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.node.checkpoint_agent import Agent


def make_agent(tmp_path: Path, **extra: object) -> Agent:
    """An agent watching `tmp_path/ckpt`, its state in `tmp_path/state`, whose run is this
    process (so it never ends by itself); `extra` overrides its config."""
    for name in ("ckpt", "run", "state"):
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "run" / "pid").write_text(str(os.getpid()))  # "the run": this process
    config = {
        "job_id": "j1",
        "rank": 0,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "run_dir": str(tmp_path / "run"),
        "state_dir": str(tmp_path / "state"),
        "exclude": [],
        "quiet_s": 0.2,
        "interval_s": 0.05,
        "store": None,
        "restored": {},
        **extra,
    }
    return Agent(config)
