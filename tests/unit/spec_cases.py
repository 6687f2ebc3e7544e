"""Shared inputs and helpers of the job spec tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.loading import load_job

# The example of DESIGN.md ("Job spec"), verbatim.
FULL_EXAMPLE = """\
name: cifar-ddp
workdir: .                      # synced to every node, honours .gitignore and .orchignore
data: [{src: ./data, dst: ~/data}]
setup: pip install -r requirements.txt
run: python -m orch_trainer.train --epochs 5     # run under torchrun on every node
resources: {gpus_per_node: 4, accelerator: A10G, nodes: 2, spot: true, max_price_per_hour: 3.0}
checkpoint: {dir: ~/ckpt, pull_every: 60}
budget: {max_cost_usd: 20, idle_timeout: 600, max_runtime: 4h}
recovery: {max_recoveries: 5}
env: {NCCL_DEBUG: WARN}
"""

MINIMAL = """\
name: tiny
workdir: .
run: python train.py
"""

# Block style, so that each field sits on its own line (line numbers are asserted below).
BLOCK = """\
name: block-job
workdir: .
data:
  - src: ./data
    dst: ~/data
run: python train.py
resources:
  nodes: 2
  gpus_per_node: 2
budget:
  max_cost_usd: 5
  max_runtime: 1h30m
env:
  NCCL_DEBUG: WARN
"""


def write(directory: Path, text: str, name: str = "job.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def spec_error(path: Path, overrides: dict[str, object] | None = None) -> str:
    """Load `path`, expect a SpecError, return its message (and check it is clean)."""
    with pytest.raises(SpecError) as info:
        load_job(path, overrides)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "Traceback" not in message
    assert "errors.pydantic.dev" not in message
    assert "validation error" not in message
    return message


def replace_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)
