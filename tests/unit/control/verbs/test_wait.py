"""`orch wait JOB`: it returns once the job's state is final, with the job's exit code, gives up
at --timeout with 124, refuses an unknown job with 2, and never waits forever on a job whose
controller refuses it. The ledger is real (SQLite); the controller is a lock held by the test."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.control.process.controllers import ControllerLock
from orchestrator.control.verbs.wait import job_exit_code, wait_for_end
from orchestrator.errors import OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine
from tests.support.in_process import run_main


@contextmanager
def live_controller(home: Path) -> Iterator[None]:
    """The job's controller lock, held as a live controller holds it."""
    lock = ControllerLock(Settings(home=home), "j-1")
    assert lock.acquire()
    try:
        yield
    finally:
        lock.release()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("ORCH_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "orch"
    monkeypatch.setenv("ORCH_HOME", str(home))
    return home


def add_job(home: Path, state: JobState, exit_code: int | None = None) -> Ledger:
    ledger = Ledger(make_engine(home / "orch.db"))
    ledger.add_job(
        Job(
            id="j-1", name="j", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=datetime.now(UTC), state=state.value,
            exit_code=exit_code,
        )
    )  # fmt: skip
    return ledger


@pytest.mark.parametrize(
    ("state", "code", "expected"),
    [
        (JobState.SUCCEEDED, 0, 0),
        (JobState.FAILED, 1, 1),
        (JobState.BUDGET_STOPPED, 4, 4),
        (JobState.CANCELLED, 130, 130),
        (JobState.FAILED, None, 1),
    ],
)
def test_a_finished_job_gives_its_exit_code_at_once(
    home: Path, state: JobState, code: int | None, expected: int
) -> None:
    add_job(home, state, code)
    exit_code, out, err = run_main(["wait", "j-1"])
    assert exit_code == expected, out + err
    assert f"job j-1 {state.value}" in out
    exit_code, out, _ = run_main(["wait", "j-1", "--json"])
    assert exit_code == expected and json.loads(out)["state"] == state.value


def test_it_returns_when_the_running_job_ends(home: Path) -> None:
    ledger = add_job(home, JobState.RUNNING)
    settings = Settings(home=home)
    with live_controller(home):

        def finish() -> None:
            time.sleep(0.5)  # on purpose: the job ends while `orch wait` waits
            ledger.update_job("j-1", state=JobState.SUCCEEDED, exit_code=0)

        threading.Thread(target=finish).start()
        started = time.monotonic()
        job = wait_for_end(settings, ledger, "j-1", poll_s=0.05)
    assert job is not None and job_exit_code(job) == 0
    assert 0.4 < time.monotonic() - started < 5


def test_timeout_and_unknown_job(home: Path) -> None:
    add_job(home, JobState.RUNNING)
    with live_controller(home):
        code, _, err = run_main(["wait", "j-1", "--timeout", "1s"])
    assert code == 124 and "still RUNNING" in err
    code, _, err = run_main(["wait", "nope"])
    assert code == 2 and "no job 'nope'" in err


def test_a_job_its_controller_refuses_is_an_error_not_an_endless_wait(home: Path) -> None:
    ledger = add_job(home, JobState.RUNNING)
    ledger.add_event("j-1", "REFUSED", "launched as account 1, this controller is account 2")
    with pytest.raises(OrchError) as refused:
        wait_for_end(Settings(home=home), ledger, "j-1", poll_s=0.01, timeout_s=5)
    assert "account 2" in refused.value.message
