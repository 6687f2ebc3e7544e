"""What `orch cancel` does, apart from showing it: stop one job and say how it ended.

A job is stopped by whoever drives it: its live controller on this machine is told to
(SIGTERM, the same stop as Ctrl-C); on a shared ledger, a controller on another machine (it
holds the job's live controller lease) is asked through the ledger (`ask_cancel` on its lease,
which it reads at its next renewal and carries out as the same stop); with none, cancel takes
the controller's lock (and, on a shared ledger, the lease) and ends the nodes itself.

A member acts only on jobs it drives: a controller on another machine that does not take up
the request within a lease's length is named, and nothing is touched (`CancelRefused`).
`force` takes the lease from that controller instead, waits for it to stop (it does at its
next renewal), and ends the nodes from here, without the trainers' checkpoint.
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
from orchestrator.control.process.controllers import ControllerLock, controller_pid
from orchestrator.control.process.lease_keeper import CANCELLING, LeaseKeeper
from orchestrator.control.process.machine_id import holder_id, machine_id
from orchestrator.control.process.ownership import check_identity
from orchestrator.control.run.end_nodes import end_nodes
from orchestrator.control.verbs.commands import ledger_partition
from orchestrator.errors import OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import ControllerLease, Ledger, utcnow
from orchestrator.providers import get_provider
from orchestrator.providers.base import Provider


class CancelRoute(enum.Enum):
    """How a cancel ended its job."""

    ALREADY_ENDED = "already_ended"  # the job was final before cancel acted: nothing done
    CONTROLLER = "controller"  # its live controller was told (SIGTERM) and ended it
    ASKED = "asked"  # its controller on another machine was asked through the ledger, ended it
    NO_CONTROLLER = "no_controller"  # no controller ran: cancel ended the nodes itself
    FORCED = "forced"  # --force: another machine's controller was stopped, nodes ended here


@dataclass(frozen=True)
class CancelResult:
    job_id: str
    route: CancelRoute
    state: JobState  # the job's final state (CANCELLED, unless it ended some other way first)
    terminated: tuple[str, ...] = ()  # nodes cancel itself ended (NO_CONTROLLER, FORCED)
    driver: str | None = None  # the machine whose controller drove the job (ASKED, FORCED)


class CancelRefused(OrchError):
    """The job's controller on another machine did not take up the cancel asked of it."""


CONTROLLER_PID_WAIT_S = 10.0  # a controller that took the lock writes its pid this soon
CONTROLLER_STOP_WAIT_S = 600.0  # a signalled controller's stop (checkpoint, pull, terminate)
# A controller asked through the ledger sees the request at its next renewal, within its
# lease (`ledger.controller_lease`); this much more for its stop to show in the ledger.
ASK_MARGIN_S = 5.0
OnLease = Callable[[ControllerLease], None]


def cancel(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    *,
    force: bool = False,
    on_signalled: Callable[[int], None] | None = None,
    on_asked: OnLease | None = None,
    on_forced: OnLease | None = None,
    pid_wait_s: float = CONTROLLER_PID_WAIT_S,
    stop_wait_s: float = CONTROLLER_STOP_WAIT_S,
    ask_wait_s: float | None = None,
    poll_s: float = 0.5,
) -> CancelResult:
    """Cancel job `job_id` and return once it is final.

    With a live controller (daemon or foreground submit) on this machine, that process gets
    SIGTERM (`on_signalled` hears its pid) and does the stop as on Ctrl-C: the trainers
    checkpoint, the checkpoint is pulled, the nodes are terminated; billing stops when the
    provider acknowledges that, and cancel waits up to `stop_wait_s` for the final state, then
    raises `OrchError` (`orch down` ends the nodes at once). A lock held by no live orch
    process after `pid_wait_s` is an `OrchError` too: try again.

    On a shared ledger, with a live controller on another machine (its live lease): that
    controller is asked through the ledger (`on_asked` hears its lease) and does the same
    stop (route ASKED); cancel waits for it as above. A controller that does not take the
    request up within `ask_wait_s` (default: the lease's length and `ASK_MARGIN_S`) has the
    request withdrawn, and `CancelRefused` names it and its machine; nothing is touched. With
    `force`, its lease is taken instead (`on_forced` hears it), cancel waits until it stopped
    (at its next renewal) and ends the nodes itself, with no checkpoint pull (route FORCED).

    With no controller, cancel takes the job's controller lock itself (so none can be revived
    meanwhile; on a shared ledger the lease too), terminates the job's nodes that belong to
    this ledger (billing stops at the provider's acknowledgement; leases closed) and records
    CANCELLED, exit code 130. A node the provider no longer lists (its host is gone) is not
    ended again; nodes of other ledgers are never ended. `IdentityMismatch` is raised,
    touching nothing, when the provider acts as another cloud identity than the job's.

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
    keeper: LeaseKeeper | None = None
    forced_from: ControllerLease | None = None
    try:
        job = ledger.get_job(job_id)
        if JobState(job.state).is_final:  # its last controller finished meanwhile
            return CancelResult(job_id, CancelRoute.ALREADY_ENDED, JobState(job.state))
        provider = get_provider(job.provider, settings)
        check_job_identity(ledger, job_id, provider)  # before any lease is taken from anyone
        if settings.ledger.shared:  # another machine's controller may hold the job's lease
            keeper = LeaseKeeper(settings, ledger, job_id, on_cancel=lambda asker: None)
            claim = keeper.hold(force=force, on_forced=on_forced)
            if not claim.taken:
                keeper = None
                lock.release()
                if claim.lease is None:  # released between two reads: its controller ended
                    raise OrchError(
                        f"the controller lease of {job_id} changed hands as cancel read it",
                        hint=f"run `orch cancel {job_id}` again",
                    )
                wait = ask_wait_s if ask_wait_s is not None else _ask_wait(settings)
                return _ask(
                    settings, ledger, job_id, claim.lease, on_asked, wait, stop_wait_s, poll_s
                )
            forced_from = claim.forced_from(keeper.machine)
        # on a shared ledger cancel drives the job now: its writes and terminate hold the lease
        driving = ledger if keeper is None else keeper.fenced(ledger)
        ids = _end_here(settings, driving, job_id, provider, forced_from)
    finally:
        if keeper is not None:
            keeper.stop()
        lock.release()
    if ids is None:
        state = JobState(ledger.get_job(job_id).state)
        return CancelResult(job_id, CancelRoute.ALREADY_ENDED, state)
    if forced_from is not None:
        return CancelResult(
            job_id, CancelRoute.FORCED, JobState.CANCELLED, tuple(ids), forced_from.machine
        )
    return CancelResult(job_id, CancelRoute.NO_CONTROLLER, JobState.CANCELLED, tuple(ids))


def _end_here(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    provider: Provider,
    forced_from: ControllerLease | None,
) -> list[str] | None:
    """End the job's nodes and record it CANCELLED (the caller drives it now: it holds the
    lock, and the lease on a shared ledger); the nodes ended, or None when the job was final
    already (its last controller finished meanwhile)."""
    job = ledger.get_job(job_id)
    if JobState(job.state).is_final:
        return None
    owned = provider.list_owned(job_id=job.node_owner)
    ids = [i.instance_id for i in ledger_partition(ledger, owned).ours]
    if job.cluster_id is not None:  # a kept cluster's nodes: only while this job holds them
        held = {lease.instance_id for lease in ledger.leases(job_id, open_only=True)}
        ids = [i for i in ids if i in held]
    how = "with no live controller"
    if forced_from is not None:
        how = (
            f"by force from machine {machine_id(settings.home)}: its controller on machine "
            f"{forced_from.machine} was stopped; no checkpoint was pulled"
        )
    if ids:
        end_nodes(ledger, provider, job_id, ids, home=settings.home)
        if job.cluster_id is not None:
            Clusters(ledger).down(job.cluster_id, utcnow(), f"its job {job_id} was cancelled {how}")
    ledger.update_job(
        job_id, state=JobState.CANCELLED, exit_code=130, reason="cancelled", ended_at=utcnow()
    )
    ledger.add_event(job_id, "CANCELLED", f"cancelled {how}")
    return ids


def _ask_wait(settings: Settings) -> float:
    return settings.ledger.controller_lease + ASK_MARGIN_S


def _ask(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    live: ControllerLease,
    on_asked: OnLease | None,
    ask_wait_s: float,
    stop_wait_s: float,
    poll_s: float,
) -> CancelResult:
    """Ask the controller holding the live lease `live` to cancel the job, through the
    ledger; wait for it to take the request up, then for the final state."""
    me = holder_id(machine_id(settings.home))
    leases = ControllerLeases(ledger)
    asked = leases.ask_cancel(job_id, me)
    if asked is None:
        raise OrchError(
            f"the controller of {job_id} on machine {live.machine} stopped as it was asked",
            hint=f"run `orch cancel {job_id}` again",
        )
    event = ledger.add_event(
        job_id, "CANCEL_ASKED", f"{me} asked controller {asked.holder} (machine "
        f"{asked.machine}) through the ledger to cancel the job",
    )  # fmt: skip
    if on_asked is not None:
        on_asked(asked)
    deadline = time.monotonic() + ask_wait_s
    taken_up = False
    while True:
        state = JobState(ledger.get_job(job_id).state)
        if state.is_final:
            return CancelResult(job_id, CancelRoute.ASKED, state, driver=asked.machine)
        if time.monotonic() >= deadline:
            if taken_up:
                raise OrchError(
                    f"job {job_id} did not stop within {stop_wait_s:.0f} s of its controller "
                    f"on machine {asked.machine} taking up the cancel",
                    hint=f"`orch status {job_id}` shows where it is",
                )
            if not _took_up(ledger, job_id, event.id, state):
                break
            taken_up, deadline = True, time.monotonic() + stop_wait_s
        time.sleep(poll_s)
    leases.withdraw_cancel(job_id, me)
    raise CancelRefused(
        f"job {job_id} is driven by controller {asked.holder} on machine {asked.machine} (its "
        f"lease held since {_since(asked)}), which did not take up the cancel asked through "
        f"the ledger within {ask_wait_s:.0f} s; the request was withdrawn, nothing touched",
        hint=f"run `orch cancel {job_id}` on {asked.machine}, or `orch cancel {job_id} --force` "
        "here: it takes the lease, stops that controller and ends the nodes without pulling "
        "a checkpoint",
    )


def _took_up(ledger: Ledger, job_id: str, asked_event: int | None, state: JobState) -> bool:
    """Whether the job's controller took the cancel up: it stops, or said it cancels."""
    if state is JobState.STOPPING:
        return True
    after = asked_event or 0
    return any(e.kind == CANCELLING and (e.id or 0) > after for e in ledger.events(job_id))


def _since(lease: ControllerLease) -> str:
    return (lease.taken_at or lease.renewed_at).isoformat(timespec="seconds")


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
