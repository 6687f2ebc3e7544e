"""What `orch cancel` does, apart from showing it: stop one job and say how it ended.

A job is stopped by whoever drives it: its live controller is told to (SIGTERM, the same stop
as Ctrl-C), and with none, cancel takes the controller's lock and ends the nodes itself.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from orchestrator.config import Settings
from orchestrator.control.commands import ledger_partition
from orchestrator.control.ownership import check_identity
from orchestrator.control.reconcile import end_nodes
from orchestrator.control.supervision import ControllerLock, controller_pid
from orchestrator.errors import OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import Ledger, utcnow
from orchestrator.providers import get_provider
from orchestrator.providers.base import Provider


class CancelRoute(enum.Enum):
    """How a cancel ended its job."""

    ALREADY_ENDED = "already_ended"  # the job was final before cancel acted: nothing done
    CONTROLLER = "controller"  # its live controller was told (SIGTERM) and ended it
    NO_CONTROLLER = "no_controller"  # no controller ran: cancel ended the nodes itself


@dataclass(frozen=True)
class CancelResult:
    job_id: str
    route: CancelRoute
    state: JobState  # the job's final state (CANCELLED, unless it ended some other way first)
    terminated: tuple[str, ...] = ()  # nodes cancel itself ended (route NO_CONTROLLER only)


CONTROLLER_PID_WAIT_S = 10.0  # a controller that took the lock writes its pid this soon
CONTROLLER_STOP_WAIT_S = 600.0  # a signalled controller's stop (checkpoint, pull, terminate)


def cancel(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    *,
    on_signalled: Callable[[int], None] | None = None,
    pid_wait_s: float = CONTROLLER_PID_WAIT_S,
    stop_wait_s: float = CONTROLLER_STOP_WAIT_S,
    poll_s: float = 0.5,
) -> CancelResult:
    """Cancel job `job_id` and return once it is final.

    With a live controller (daemon or foreground submit), that process gets SIGTERM
    (`on_signalled` hears its pid) and does the stop as on Ctrl-C: the trainers checkpoint,
    the checkpoint is pulled, the nodes are terminated; billing stops when the provider
    acknowledges that, and cancel waits up to `stop_wait_s` for the final state, then raises
    `OrchError` (`orch down` ends the nodes at once). A lock held by no live orch process
    after `pid_wait_s` is an `OrchError` too: try again.

    With no controller, cancel takes the job's controller lock itself (so none can be revived
    meanwhile), terminates the job's nodes that belong to this ledger (billing stops at the
    provider's acknowledgement; leases closed) and records CANCELLED, exit code 130. A node
    the provider no longer lists (its host is gone) is not ended again; nodes of other ledgers
    are never ended. `IdentityMismatch` is raised, touching nothing, when the provider acts as
    another cloud identity than the job's.

    `UnknownJob` for an id the ledger does not know; a job already final is left as it is
    (route ALREADY_ENDED, its own final state).
    """
    job = ledger.get_job(job_id)
    if JobState(job.state).is_final:
        return CancelResult(job_id, CancelRoute.ALREADY_ENDED, JobState(job.state))
    # Ending the nodes here is the controller's work: done only while holding its lock, so a
    # controller that is being revived right now cannot drive the job at the same time.
    lock = ControllerLock(settings, job_id)
    if not lock.acquire():
        return _stop_controller(
            settings, ledger, job_id, on_signalled, pid_wait_s, stop_wait_s, poll_s
        )
    try:
        job = ledger.get_job(job_id)
        if JobState(job.state).is_final:  # its last controller finished meanwhile
            return CancelResult(job_id, CancelRoute.ALREADY_ENDED, JobState(job.state))
        provider = get_provider(job.provider, settings)
        check_job_identity(ledger, job_id, provider)
        owned = provider.list_owned(job_id=job.node_owner)
        ids = [i.instance_id for i in ledger_partition(ledger, owned).ours]
        if job.cluster_id is not None:  # a kept cluster's nodes: only while this job holds them
            held = {lease.instance_id for lease in ledger.leases(job_id, open_only=True)}
            ids = [i for i in ids if i in held]
        if ids:
            end_nodes(ledger, provider, job_id, ids, home=settings.home)
            if job.cluster_id is not None:
                Clusters(ledger).down(
                    job.cluster_id, utcnow(), f"its job {job_id} was cancelled with no controller"
                )
        ledger.update_job(
            job_id, state=JobState.CANCELLED, exit_code=130, reason="cancelled", ended_at=utcnow()
        )
        ledger.add_event(job_id, "CANCELLED", "cancelled with no live controller")
    finally:
        lock.release()
    return CancelResult(job_id, CancelRoute.NO_CONTROLLER, JobState.CANCELLED, tuple(ids))


def _stop_controller(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    on_signalled: Callable[[int], None] | None,
    pid_wait_s: float,
    stop_wait_s: float,
    poll_s: float,
) -> CancelResult:
    """SIGTERM to the job's live controller, then wait for the job to be final."""
    # A controller that just took the lock writes its pid a moment later: until then the
    # file may still name a dead one.
    deadline = time.monotonic() + pid_wait_s
    pid = controller_pid(settings, job_id)
    while not (pid and is_orch_process(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
        pid = controller_pid(settings, job_id)
    if not (pid and is_orch_process(pid)):
        raise OrchError(
            f"the controller of {job_id} holds its lock but names no live process",
            hint=f"run `orch cancel {job_id}` again in a moment",
        )
    os.kill(pid, signal.SIGTERM)
    if on_signalled is not None:
        on_signalled(pid)
    deadline = time.monotonic() + stop_wait_s
    while time.monotonic() < deadline:
        state = JobState(ledger.get_job(job_id).state)
        if state.is_final:
            return CancelResult(job_id, CancelRoute.CONTROLLER, state)
        time.sleep(poll_s)
    raise OrchError(
        f"job {job_id} did not stop within {stop_wait_s:.0f} s",
        hint="`orch down` ends its nodes at once",
    )


def is_orch_process(pid: int) -> bool:
    """Whether `pid` is a live orch process (a controller: daemon or foreground submit).

    Read through psutil, so it works where there is no /proc (macOS). A process that has
    exited (a zombie included) or that this user may not inspect is not one: it could not be
    signalled either."""
    try:
        args = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return False
    return any(arg.startswith("orchestrator") or arg.endswith("/orch") for arg in args)


def check_job_identity(ledger: Ledger, job_id: str, provider: Provider) -> None:
    """Raise `IdentityMismatch` when the provider acts as another identity than the job's."""
    recorded = [ledger.get_job(job_id).identity]
    recorded += [lease.identity for lease in ledger.leases(job_id, open_only=True)]
    if any(text is not None for text in recorded):
        check_identity(job_id, recorded, provider.identity())
