"""The foreground progress line shows `step 24/48`, the share done and an ETA when rank 0's
metrics carry total_steps, and the plain step otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from orchestrator.cli.console import RichReporter, step_text
from orchestrator.node.progress import Metrics, parse_metrics


def test_step_text_gives_the_share_and_the_eta_from_the_pace_so_far() -> None:
    metrics = parse_metrics('{"step": 24, "loss": 0.9, "total_steps": 48}')
    assert metrics is not None
    # 20 steps in 100 s since step 4: 5 s a step, 24 steps left
    assert step_text(metrics, (1000.0, 4), 1100.0) == "step 24/48 (50%, ETA 2m00s)"
    assert step_text(Metrics(47, total_steps=48), (0.0, 46), 5.0) == "step 47/48 (98%, ETA 5s)"
    assert step_text(metrics, (1100.0, 24), 1100.0) == "step 24/48 (50%)"  # no pace yet
    assert step_text(Metrics(24), (0.0, 0), 10.0) == "step 24"


def test_the_reporter_prints_the_step_out_of_the_total() -> None:
    out = io.StringIO()
    with RichReporter(Console(file=out, width=200), "j-1") as reporter:
        reporter.metrics(Metrics(12, loss=0.5, total_steps=48))
        reporter.metrics(Metrics(24, loss=0.4, total_steps=48))
    assert "running | step 12/48 (25%) | loss 0.5000" in out.getvalue()
    assert "running | step 24/48 (50%, ETA " in out.getvalue()
