"""The README's 60-second tour, run as written on real local nodes (the block whose marker
names this test): submit --detach, status, logs, cost, cancel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.doc_blocks import REPO, blocks, covered_by, run_commands
from tests.support.helpers import assert_nothing_left, job_json, orch_env, run_orch

pytestmark = pytest.mark.e2e

THIS = "tests/e2e/test_docs_tour.py::test_readme_tour_runs_as_written"


def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    [tour] = [b for b in blocks(REPO / "README.md") if THIS in covered_by(b.arg)]
    commands = run_commands(tour)
    assert [c.args[0] for c in commands] == ["submit", "status", "status", "logs", "cost", "cancel"]
    env = orch_env(tmp_path / "orch", ORCH_LOCAL_PRICE_PER_HOUR="0.5", ORCH_WATCH_INTERVAL="1")
    job_id = ""
    outputs: list[str] = []
    for command in commands:
        args = [job_id if arg == "JOB" else arg for arg in command.args]
        result = run_orch(args, {**env, **command.env}, timeout=300)
        output = result.stdout + result.stderr
        assert result.returncode == command.exit_code, f"orch {' '.join(args)}:\n{output}"
        if args[0] == "submit":
            job_id = result.stdout.strip().splitlines()[-1]  # the id, alone on the last line
        outputs.append(output)
    submitted, listed, one, _logs, cost, cancelled = outputs
    assert f"orch status {job_id}" in submitted  # what to do next, named with the id
    assert job_id in listed and job_id in one and job_id in cost
    assert job_id in cancelled
    job = job_json(job_id, env)
    # The demo job is short: the cancel may meet it already finished; either way it ended.
    assert job["state"] in ("CANCELLED", "SUCCEEDED"), job["reason"]
    assert_nothing_left(job)
