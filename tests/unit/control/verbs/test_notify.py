"""The end-of-job hook: a real `sh` with the job's document on stdin, a real ledger for its
events; a hook that fails or hangs never raises and never outlives its timeout."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from orchestrator.config import ControllerSettings, Settings
from orchestrator.control.verbs.notify import notify_command, notify_end, save_notify
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger
from tests.support.waiting import wait_until

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def settings_with(tmp_path: Path, notify: str | None = None) -> Settings:
    return Settings(home=tmp_path / "orch", controller=ControllerSettings(notify=notify))


def add_job(ledger: Ledger, state: JobState, exit_code: int | None = None) -> Job:
    return ledger.add_job(
        Job(
            id="j-1", name="j", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=T0, state=state, exit_code=exit_code,
            reason="boom" if exit_code else None,
        )
    )  # fmt: skip


def running(pid: int) -> bool:
    """Whether `pid` runs (a killed process waiting to be reaped does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kinds(ledger: Ledger) -> list[str]:
    return [e.kind for e in ledger.events("j-1")]


def test_the_hook_reads_the_job_s_document_and_sees_its_state(
    tmp_path: Path, ledger: Ledger
) -> None:
    out = tmp_path / "out"
    settings = settings_with(
        tmp_path, f'cat > {out}.json; echo "$ORCH_JOB_ID $ORCH_JOB_STATE $ORCH_EXIT_CODE" > {out}'
    )
    add_job(ledger, JobState.FAILED, exit_code=1)
    notified = notify_end(settings, ledger, "j-1")
    assert notified is not None and notified.ok
    document = json.loads(out.with_suffix(".json").read_text())
    assert (document["id"], document["state"], document["reason"]) == ("j-1", "FAILED", "boom")
    assert out.read_text() == "j-1 FAILED 1\n"
    assert kinds(ledger) == ["NOTIFIED"]


def test_a_failing_hook_is_a_warning_with_its_last_error_line(
    tmp_path: Path, ledger: Ledger
) -> None:
    add_job(ledger, JobState.SUCCEEDED, exit_code=0)
    hook = "echo first >&2; echo 'curl: (6) Could not resolve host' >&2; exit 6"
    notified = notify_end(settings_with(tmp_path, hook), ledger, "j-1")
    assert notified is not None and notified.exit_code == 6
    (event,) = ledger.events("j-1")
    assert (event.kind, event.message) == (
        "WARNING", "notify hook exited 6: curl: (6) Could not resolve host",
    )  # fmt: skip


def test_a_hanging_hook_is_killed_with_its_children_at_the_timeout(
    tmp_path: Path, ledger: Ledger
) -> None:
    pid_file = tmp_path / "child.pid"
    add_job(ledger, JobState.SUCCEEDED, exit_code=0)
    hook = f"sleep 300 & echo $! > {pid_file}; wait"  # a child that outlives sh if left alone
    started = time.monotonic()
    notified = notify_end(settings_with(tmp_path, hook), ledger, "j-1", timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert notified is not None and notified.exit_code is None
    child = int(pid_file.read_text())
    assert wait_until(lambda: not running(child), "the hook's child to be killed", 5)
    assert ledger.events("j-1")[-1].message == "notify hook killed after 1 s"


def test_nothing_runs_without_a_hook_or_before_the_job_ended(
    tmp_path: Path, ledger: Ledger
) -> None:
    marker = tmp_path / "ran"
    add_job(ledger, JobState.RUNNING)
    assert notify_end(settings_with(tmp_path, f"touch {marker}"), ledger, "j-1") is None
    assert notify_end(settings_with(tmp_path), ledger, "j-1") is None
    assert not marker.exists() and kinds(ledger) == []


def test_a_job_s_own_hook_wins_over_the_configuration_s_and_is_private(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, "echo from-config")
    assert notify_command(settings, "j-1") == "echo from-config"
    save_notify(settings, "j-1", "curl -d @- https://hooks.example/T0KEN")
    assert notify_command(settings, "j-1") == "curl -d @- https://hooks.example/T0KEN"
    assert (settings.job_dir("j-1") / "notify.json").stat().st_mode & 0o077 == 0


def test_an_unreadable_ledger_never_raises(tmp_path: Path, ledger: Ledger) -> None:
    assert notify_end(settings_with(tmp_path, "true"), ledger, "no-such-job") is None
