"""What `orch wait JOB` does: block until the job ends and give back how it ended.

The job is read from the ledger every `poll_s` seconds. Its controller keeps driving it as
usual; if that controller is gone, a new one is started (as any orch command does), at most
once every `revive_every_s` seconds. A job whose controller refuses it (another cloud identity)
cannot end by itself: that is an error naming the reason, not an endless wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.config import Settings
from orchestrator.control.process.controllers import (
    controller_running,
    refused_by_last_controller,
    revive_controllers,
)
from orchestrator.errors import OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger


def job_exit_code(job: Job) -> int:
    """The exit code a finished job gives `orch submit` and `orch wait`: the recorded one, else
    0 for SUCCEEDED and 1 otherwise."""
    if job.exit_code is not None:
        return job.exit_code
    return 0 if job.state == JobState.SUCCEEDED.value else 1


def wait_for_end(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    *,
    timeout_s: float | None = None,
    poll_s: float = 1.0,
    revive_every_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Job | None:
    """The job once its state is final, or None when `timeout_s` passed first. Raises
    UnknownJob for an id the ledger does not know, OrchError when its controller refuses it."""
    started = clock()
    revived_at: float | None = None
    while True:
        job = ledger.get_job(job_id)
        if JobState(job.state).is_final:
            return job
        now = clock()
        if timeout_s is not None and now - started >= timeout_s:
            return None
        if not controller_running(settings, job_id):
            refused = refused_by_last_controller(ledger, job_id)
            if refused is not None:
                raise OrchError(
                    f"job {job_id} has no controller that will drive it: {refused}",
                    hint="run orch from the environment the job was launched in",
                )
            if revived_at is None or now - revived_at >= revive_every_s:
                revive_controllers(settings, ledger, [job_id])
                revived_at = now
        sleep(poll_s)
