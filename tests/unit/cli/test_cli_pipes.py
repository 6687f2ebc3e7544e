"""Piped output: with stdout a pipe, `orch` never wraps or cuts an id, a path or an error.

The real command runs in its own process with stdout and stderr pipes and no COLUMNS, as in
`orch status | grep ID`; the ledger is a real SQLite file."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.job_state import JobState
from orchestrator.ledger.store import CheckpointRecord, Job, Lease, Ledger, make_engine
from tests.support.helpers import ORCH, REPO

LONG_ID = "a-job-whose-name-is-much-longer-than-any-terminal-is-wide-" + "0123456789" * 8
LONG_NAME = "step-000042-" + "x" * 90
REASON = "rank 3 exited 1: see /var/tmp/" + "deeply/nested/" * 8 + "trace.log"


def piped_orch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.pop("COLUMNS", None)
    env.update({"ORCH_HOME": str(home), "PYTHONPATH": str(REPO), "TERM": "xterm"})
    return subprocess.run(
        [*ORCH, *args], env=env, cwd=REPO, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip


def a_long_job(home: Path) -> Path:
    """A failed job with a long id, a long reason, one lease and one long checkpoint; returns
    the checkpoint's path in the mirror."""
    ledger = Ledger(make_engine(home / "orch.db"))
    now = datetime.now(UTC)
    ledger.add_job(
        Job(
            id=LONG_ID, name="long", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=now, ended_at=now, state=JobState.FAILED.value,
            exit_code=1, reason=REASON, step=42,
        )
    )  # fmt: skip
    ledger.open_lease(
        Lease(
            job_id=LONG_ID, cluster=LONG_ID, provider="local", instance_id=f"i-{LONG_ID}",
            rank=0, market="on-demand", instance_type="local", price_per_hour=Decimal("0.5"),
            launched_at=now, ended_at=now,
        )
    )  # fmt: skip
    ledger.add_checkpoint(
        CheckpointRecord(job_id=LONG_ID, name=LONG_NAME, step=42, size_bytes=10, pulled_at=now)
    )
    return Settings(home=home).job_dir(LONG_ID) / "checkpoints" / LONG_NAME


def test_ids_paths_and_errors_come_whole_through_a_pipe(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    checkpoint = a_long_job(home)
    listing = piped_orch(home, "status")
    assert listing.returncode == 0, listing.stderr
    assert LONG_ID in listing.stdout
    detail = piped_orch(home, "status", LONG_ID)
    assert detail.returncode == 0, detail.stderr
    for whole in (LONG_ID, f"i-{LONG_ID}", str(checkpoint), REASON):
        assert whole in detail.stdout, whole
    bill = piped_orch(home, "cost")
    assert bill.returncode == 0 and LONG_ID in bill.stdout
    missing = f"{LONG_ID}-gone"
    error = piped_orch(home, "logs", missing)
    assert error.returncode == 2
    assert f"no job '{missing}'" in error.stderr
