"""A controller's lease on its job, on a shared ledger: taken before driving, renewed while
driving, and the controller stopped at once when it is lost.

On a ledger other machines use (`LedgerSettings.shared`), the job's controller lock (a file
in this ORCH_HOME) only keeps out the processes of this machine. Every controller therefore
also holds the job's row in `controller_lease` (`ledger.controller_leases`): `LeaseKeeper.take`
takes it (after the lock, so a lease of this machine with no lock holder is a dead process's
and is taken over), `start` renews it every `ledger.lease_renewal` seconds on a thread of its
own, through every phase of the run (a launch or a sync can outlast a lease; the supervisor's
checks run only while training is watched), and `stop` releases it when the controller is
done with the job.

A renewal that finds the lease another holder's (it let the lease expire and someone took
it over, or `orch cancel --force` took it), or that cannot reach the ledger until the lease is
about to expire, means another controller may be driving the job: the keeper writes a
LEASE_LOST event and ends this process on the spot (`os._exit`), as if it were killed, so that
nothing more happens to the job's nodes from here. That is safe by design: a killed controller
leaves the nodes running and the ledger consistent, for the one that holds the lease.

A renewal comes only every `ledger.lease_renewal` seconds, and a process that was paused (a
laptop asleep) resumes with its next one still ahead. So the controller drives the job through
`fenced(ledger)`: each of its writes about the job, and each check before it ends nodes, is
conditional on this lease as taken (`ledger.fencing`), and the first one that finds the lease
another's stops the process the same way (one LEASE_LOST event), before anything is written or
ended.

Leases are judged by the ledger's clock (`ledger.clock`), never this machine's; how long this
process may go on without a renewal is measured on its own monotonic clock from the moment it
asked for the last one that succeeded.

A renewal also reads any cancel another machine asked through the ledger (`orch cancel` of a
job this controller drives): the keeper writes a CANCELLING event and cancels the job as a
local `orch cancel` would (SIGTERM to this process: the trainers checkpoint, the checkpoint is
pulled, the nodes end, CANCELLED).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from orchestrator.config import Settings
from orchestrator.control.process.machine_id import holder_id, machine_id
from orchestrator.errors import OrchError
from orchestrator.ledger.controller_leases import ControllerLeases, LeaseClaim
from orchestrator.ledger.fencing import Fence
from orchestrator.ledger.store import ControllerLease, Ledger

LEASE_LOST = "LEASE_LOST"  # the event a controller writes when it stops for a lost lease
LEASE_TAKEN_OVER = "LEASE_TAKEN_OVER"  # the event of a controller adopting an expired lease
LEASE_FORCED = "LEASE_FORCED"  # the event of a lease taken from a live holder (`--force`)
CANCELLING = "CANCELLING"  # the event of a controller taking up a cancel asked of it
LOST_EXIT_CODE = 1  # the exit status of a controller that stopped for a lost lease

OnLost = Callable[[str], None]  # called with why; the default ends the process
OnCancel = Callable[[str], None]  # called with who asked; the default is SIGTERM to itself


class LeaseKeeper:
    """The lease of job `job_id` for this process, on the ledger of `settings` (see the
    module docstring). No I/O until `take`."""

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        job_id: str,
        *,
        on_lost: OnLost | None = None,
        on_cancel: OnCancel | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.job_id = job_id
        self.machine = machine_id(settings.home)
        self.holder = holder_id(self.machine)
        self.length_s = settings.ledger.controller_lease
        self.every_s = settings.ledger.lease_renewal
        self.leases = ControllerLeases(ledger)
        self._on_lost = on_lost or self._stop_process
        self._on_cancel = on_cancel or self._cancel_process
        self._monotonic = monotonic
        self._expires: float | None = None  # on `monotonic`: when the lease runs out here
        self._fence: Fence | None = None  # the lease as this keeper took it
        self._cancel_taken = False
        self._lost_said = False  # its LEASE_LOST event was written (once, whoever found it)
        self._lost_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, *, force: bool = False) -> LeaseClaim:
        """Take the lease (the caller holds the job's controller lock here); the claim says
        whether it is ours, else whose it is. A lease taken over from another holder is
        written as a LEASE_TAKEN_OVER event. With `force`, a live lease of another machine is
        taken too (LEASE_FORCED): its holder stops at its next renewal (`wait_stopped`)."""
        asked = self._monotonic()
        claim = self.leases.take(
            self.job_id, self.holder, self.machine, length_s=self.length_s,
            dead_on_this_machine=True, force=force,
        )  # fmt: skip
        if claim.taken:
            self._expires = asked + self.length_s
            taken_at = claim.lease.taken_at if claim.lease is not None else None
            self._fence = Fence(
                self.job_id, self.holder, taken_at, self.length_s, on_lost=self._lost
            )
            if claim.previous is not None:
                self._taken_over(claim)
        return claim

    def _taken_over(self, claim: LeaseClaim) -> None:
        previous = claim.previous
        if previous is None:
            return
        if claim.forced_from(self.machine) is not None:
            kind, how = LEASE_FORCED, "by force (--force) while its holder still renewed it"
        else:  # expired, or a process of this machine's that no longer holds the job's lock
            last = previous.renewed_at.isoformat(timespec="seconds")
            kind, how = LEASE_TAKEN_OVER, f"which was not renewed after {last}"
        self.ledger.add_event(
            self.job_id, kind,
            f"controller {self.holder} took over the lease of {previous.holder} "
            f"(machine {previous.machine}), {how}",
        )  # fmt: skip

    def fenced(self, ledger: Ledger | None = None) -> Ledger:
        """`ledger` (by default the keeper's) with every write, and every check before ending
        nodes, conditional on this lease as taken (`ledger.fencing`); one that finds the lease
        another's stops the controller as a lost renewal does. Only after a successful `take`."""
        if self._fence is None:
            raise RuntimeError(f"the lease of {self.job_id} is not taken: nothing to fence with")
        return (ledger or self.ledger).fenced(self._fence)

    def hold(
        self, *, force: bool = False, on_forced: Callable[[ControllerLease], None] | None = None
    ) -> LeaseClaim:
        """`take` (with `force`) and, once taken, keep the lease renewed (`start`); a lease
        taken from a live holder elsewhere is told to `on_forced` and waited out
        (`wait_stopped`), so the caller drives the job alone when this returns. The claim
        says whether the lease is ours, else whose it is."""
        claim = self.take(force=force)
        if not claim.taken:
            return claim
        self.start()
        forced_from = claim.forced_from(self.machine)
        if forced_from is not None:
            if on_forced is not None:
                on_forced(forced_from)
            self.wait_stopped(forced_from)
        return claim

    def wait_stopped(self, previous: ControllerLease, *, poll_s: float = 0.5) -> None:
        """Return once the holder of the lease `previous` (taken from it by `take(force=
        True)`) has stopped driving the job: it wrote LEASE_LOST at its next renewal, or
        that lease would have run out (the ledger's clock), after which it stops by itself."""
        while self.leases.now() < previous.expires_at:
            if any(
                event.kind == LEASE_LOST and previous.holder in event.message
                for event in self.ledger.events(self.job_id)
            ):
                return
            time.sleep(poll_s)

    def start(self) -> None:
        """Renew the lease every `every_s` seconds on a daemon thread until `stop`."""
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease {self.job_id}", daemon=True
        )
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing; with `release`, give the lease up (the job needs no controller of
        ours any more). A release the ledger refuses lets the lease expire instead."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every_s + 5)
        if release and self._expires is not None:
            with contextlib.suppress(SQLAlchemyError, OrchError):
                self.leases.release(self.job_id, self.holder)
            self._expires = None

    def renew(self) -> bool:
        """Renew once; True while the lease is ours. On a loss, `on_lost` is called (by
        default the process ends there) and False returned. A cancel asked of the lease is
        taken up once (`on_cancel`)."""
        asked = self._monotonic()
        try:
            held = self.leases.renew(self.job_id, self.holder, length_s=self.length_s)
        except (SQLAlchemyError, OrchError) as exc:
            if self._expires is not None and asked + self.every_s < self._expires:
                return True  # try again next turn, while the lease still runs
            self._lost(f"the ledger did not answer its renewals before its lease expired ({exc})")
            return False
        if held is not None:
            self._expires = asked + self.length_s
            if held.cancel_by is not None and not self._cancel_taken:
                self._take_cancel(held)
            return True
        current = self.leases.get(self.job_id)
        taker = f"{current.holder} (machine {current.machine})" if current else "nobody"
        self._lost(f"its lease expired and is now held by {taker}")
        return False

    def _take_cancel(self, lease: ControllerLease) -> None:
        self._cancel_taken = True
        when = lease.cancel_at.isoformat(timespec="seconds") if lease.cancel_at else "?"
        asker = f"{lease.cancel_by}, asked through the ledger at {when}"
        with contextlib.suppress(SQLAlchemyError, OrchError):
            self.ledger.add_event(
                self.job_id, CANCELLING, f"controller {self.holder} cancels the job for {asker}"
            )
        self._on_cancel(asker)

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.every_s):
            if not self.renew():
                return

    def _lost(self, why: str) -> None:
        message = (
            f"controller {self.holder} stopped driving the job: {why}; it left the job's nodes "
            "as they were, to the lease's holder"
        )
        with self._lost_lock:  # the renewal thread and a fenced write may both find it
            said, self._lost_said = self._lost_said, True
        if not said:
            with contextlib.suppress(SQLAlchemyError, OrchError):
                self.ledger.add_event(self.job_id, LEASE_LOST, message)
        self._expires = None
        self._stopping.set()
        self._on_lost(message)

    @staticmethod
    def _cancel_process(asker: str) -> None:
        """Cancel the job as a local `orch cancel` does: SIGTERM to this controller."""
        print(f"orch: cancelled by {asker}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    @staticmethod
    def _stop_process(message: str) -> None:
        """Stop this controller at once: no teardown, no further command to any node."""
        print(f"orch: {message}", file=sys.stderr, flush=True)
        os._exit(LOST_EXIT_CODE)


def keep_lease(settings: Settings, ledger: Ledger, job_id: str) -> LeaseKeeper | None:
    """On a shared ledger, take job `job_id`'s lease and keep it renewed until the keeper's
    `stop` (the caller holds the job's controller lock, and drives the job); None on a
    ledger of this ORCH_HOME's own. Raises OrchError when another controller holds it."""
    if not settings.ledger.shared:
        return None
    keeper = LeaseKeeper(settings, ledger, job_id)
    claim = keeper.take()
    if not claim.taken:
        holder = claim.lease.holder if claim.lease is not None else "another controller"
        raise OrchError(
            f"job {job_id} is driven by {holder}, which holds its controller lease",
            hint="`orch status` shows it; nothing was touched",
        )
    keeper.start()
    return keeper
