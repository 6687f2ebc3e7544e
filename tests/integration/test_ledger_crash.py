"""The ledger survives a writer killed mid-transaction, and readers never meet a lock error.

A process writes the ledger the way a controller does (tests/support/ledger_load.py), as fast as it
can, and is killed with SIGKILL at random moments, over and over on the same file: after each
kill the ledger passes `check_ledger`, every job is whole (its two leases and its launch event
were one transaction) and every round the writer reported done is in it. Then many readers,
`orch status --json` processes and tight read loops, run beside one writer: none sees
"database is locked" and neither does the writer.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.ledger.check import check_ledger
from tests.support.fuzzing import trials
from tests.support.helpers import REPO, orch_env, run_orch
from tests.support.waiting import wait_until

KILLS = trials(8, 4)


def _load(mode: str, path: Path, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.ledger_load", mode, str(path), str(seconds)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _whole_jobs(path: Path) -> tuple[int, list[str]]:
    """(jobs, problems): each job has exactly its 2 leases and its LAUNCHED event."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT j.id, (SELECT count(*) FROM lease l WHERE l.job_id = j.id),"
            " (SELECT count(*) FROM event e WHERE e.job_id = j.id AND e.kind = 'LAUNCHED')"
            " FROM job j"
        ).fetchall()
    broken = [f"{job}: {n} leases, {e} launch events" for job, n, e in rows if (n, e) != (2, 1)]
    return len(rows), broken


def _succeeded(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT id FROM job WHERE state = 'SUCCEEDED'")}


def test_a_writer_killed_at_random_moments_leaves_a_consistent_ledger(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    table = [f"{'kill':>4} {'moment':>18} {'rounds done':>11} {'jobs':>5}  ledger"]
    completed_total = 0
    for trial in range(KILLS):
        writer = _load("write", path, 120)
        # The first kill may land while the file and its tables are being created; the others
        # land while it writes, which is where a transaction can be cut.
        if trial == 0:
            delay = rng.uniform(0.2, 2.0)
            moment = f"{delay:.2f} s from start"
        else:
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == "ready", writer.stderr
            delay = rng.uniform(0.0, 1.0)
            moment = f"{delay:.2f} s writing"
        time.sleep(delay)  # the trial's seeded moment
        writer.send_signal(signal.SIGKILL)
        out, err = writer.communicate(timeout=30)
        assert writer.returncode == -signal.SIGKILL, err
        assert "locked" not in err, err
        done = [line.split()[1] for line in out.splitlines() if line.startswith("round ")]
        if not path.exists():
            assert not done  # killed before it created the file
            table.append(f"{trial:>4} {moment:>18} {0:>11} {0:>5}  (no file yet)")
            continue
        result = check_ledger(path)
        assert result.ok, f"after kill {trial} (seed {seed}):\n{result}"
        jobs, broken = _whole_jobs(path)
        assert broken == [], f"half-written jobs after kill {trial} (seed {seed}): {broken}"
        pid = writer.pid
        missing = {f"crash-{pid}-{i}" for i in done} - _succeeded(path)
        assert not missing, f"rounds reported done but not in the ledger: {missing}"
        completed_total += len(done)
        table.append(f"{trial:>4} {moment:>18} {len(done):>11} {jobs:>5}  ok")
    print("\n".join(table))
    assert completed_total > 0, "\n".join(table)


def test_many_readers_and_one_writer_never_see_a_locked_database(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    path = home / "orch.db"
    seconds = float(trials(20, 10))
    writer = _load("write", path, seconds)

    def made() -> bool:
        assert writer.poll() is None, writer.stderr
        return path.exists()

    wait_until(made, "the writer's ledger file", 30, interval=0.1)
    readers = [_load("read", path, seconds - 2) for _ in range(4)]

    env = orch_env(home)
    statuses: list[subprocess.CompletedProcess[str]] = []

    def status_loop() -> None:
        while writer.poll() is None:
            statuses.append(run_orch(["status", "--json"], env, timeout=120))

    threads = [threading.Thread(target=status_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    out, err = writer.communicate(timeout=seconds + 120)
    for thread in threads:
        thread.join(timeout=180)

    assert writer.returncode == 0, err
    assert "locked" not in err, err
    rounds = sum(1 for line in out.splitlines() if line.startswith("round "))
    assert rounds > 0
    for reader in readers:
        reads_out, reads_err = reader.communicate(timeout=120)
        assert reader.returncode == 0, reads_out + reads_err
        assert int(reads_out.split()[1]) > 0
    assert len(statuses) >= 4
    for status in statuses:
        assert status.returncode == 0, status.stderr
        assert "locked" not in status.stderr + status.stdout
        assert isinstance(json.loads(status.stdout)["jobs"], list)
    result = check_ledger(path)
    assert result.ok, str(result)


def test_cancelling_a_job_without_a_controller_leaves_a_consistent_ledger(
    tmp_path: Path,
) -> None:
    """`orch cancel` of a job whose controller is gone ends it with an end time and exit code."""
    from orchestrator.job_state import JobState
    from orchestrator.ledger.store import Job, Ledger, make_engine, utcnow

    home = tmp_path / "orch"
    ledger = Ledger(make_engine(home / "orch.db"))
    ledger.add_job(
        Job(id="orphan-1", name="orphan", state=JobState.RUNNING, provider="local", nodes=1,
            gpus_per_node=1, spec_json="{}", spec_path="job.yaml", created_at=utcnow(),
            started_at=utcnow())
    )  # fmt: skip
    ledger.engine.dispose()
    result = run_orch(["cancel", "orphan-1"], orch_env(home), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    check = check_ledger(home / "orch.db")
    assert check.ok, str(check)
    with sqlite3.connect(home / "orch.db") as db:
        state, ended, code = db.execute(
            "SELECT state, ended_at, exit_code FROM job WHERE id = 'orphan-1'"
        ).fetchone()
    assert (state, code) == ("CANCELLED", 130) and ended is not None
