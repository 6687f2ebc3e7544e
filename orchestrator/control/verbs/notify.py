"""The end-of-job hook: a command of the user's that hears when a job ended, e.g. to post to a
chat webhook with `curl -d @- URL`.

A job's hook is `orch submit --notify CMD`, kept in jobs/<id>/notify.json (0600: a webhook's
address is a secret), else `controller.notify` of config.yaml. The controller that ends the job
(the foreground submit or the detached one) runs it once, after the nodes are gone, as
`sh -c CMD` with the job's JSON document (`orch status JOB --json` without the detail) on its
stdin and ORCH_JOB_ID, ORCH_JOB_STATE and ORCH_EXIT_CODE in its environment. It never changes
the job's outcome and never keeps a node billing: it runs after teardown, for at most
`NOTIFY_TIMEOUT_S` (then its whole process group is killed), and its failure is a WARNING event
of the job. A controller killed between teardown and the hook leaves the job unannounced: the
hook runs at most once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from orchestrator.config import Settings
from orchestrator.control.process.controllers import write_private_json
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger

NOTIFY_RECORD = "notify.json"
NOTIFY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Notified:
    """How the hook went: its exit code (None: killed at the timeout) and how long it took."""

    command: str
    exit_code: int | None
    seconds: float
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def save_notify(settings: Settings, job_id: str, command: str) -> None:
    """Keep `command` as the hook of job `job_id` (over `controller.notify`)."""
    directory = settings.job_dir(job_id)
    directory.mkdir(parents=True, exist_ok=True)
    write_private_json(directory / NOTIFY_RECORD, {"command": command})


def notify_command(settings: Settings, job_id: str) -> str | None:
    """The hook of job `job_id`: its own, else the configuration's; None when there is none."""
    path = settings.job_dir(job_id) / NOTIFY_RECORD
    if path.exists():
        return json.loads(path.read_text())["command"]
    return settings.controller.notify


def notify_end(
    settings: Settings, ledger: Ledger, job_id: str, *, timeout_s: float = NOTIFY_TIMEOUT_S
) -> Notified | None:
    """Run the job's hook if it has one and the job is final; None when nothing ran.

    Never raises: it runs in the controller's last steps, where nothing may mask how the job
    ended. A non-zero exit, a timeout or a command that cannot start is written as a WARNING
    event (a NOTIFIED event when it succeeded); a ledger that cannot be read or written
    leaves the hook unrun or its result unrecorded."""
    try:
        return _notify_end(settings, ledger, job_id, timeout_s)
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _notify_end(
    settings: Settings, ledger: Ledger, job_id: str, timeout_s: float
) -> Notified | None:
    from orchestrator.report.documents import job_document  # the document `orch status` shows

    command = notify_command(settings, job_id)
    job = ledger.get_job(job_id)
    if not command or not JobState(job.state).is_final:
        return None
    document = json.dumps(job_document(ledger, settings, job, detail=False))
    env = {
        **os.environ,
        "ORCH_JOB_ID": job.id,
        "ORCH_JOB_STATE": str(job.state),
        "ORCH_EXIT_CODE": "" if job.exit_code is None else str(job.exit_code),
    }
    started = time.monotonic()
    result = _run_hook(command, document, env, timeout_s)
    notified = Notified(command, result[0], time.monotonic() - started, result[1])
    if notified.ok:
        ledger.add_event(job_id, "NOTIFIED", f"notify hook exited 0 in {notified.seconds:.1f} s")
    else:
        why = (
            f"killed after {timeout_s:.0f} s"
            if notified.exit_code is None
            else f"exited {notified.exit_code}"
        )
        tail = f": {notified.stderr_tail}" if notified.stderr_tail else ""
        ledger.add_event(job_id, "WARNING", f"notify hook {why}{tail}")
    return notified


def _run_hook(
    command: str, stdin: str, env: dict[str, str], timeout_s: float
) -> tuple[int | None, str]:
    """(exit code or None at the timeout, last line of its stderr) of `sh -c command`."""
    try:
        process = subprocess.Popen(
            ["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, env=env, text=True, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        return 127, str(exc)
    try:
        _, stderr = process.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None, ""
    lines = [line for line in (stderr or "").splitlines() if line.strip()]
    return process.returncode, lines[-1][:200] if lines else ""
