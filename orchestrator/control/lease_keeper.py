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
it over), or that cannot reach the ledger until the lease is about to expire, means another
controller may be driving the job: the keeper writes a LEASE_LOST event and ends this process
on the spot (`os._exit`), as if it were killed, so that nothing more happens to the job's
nodes from here. That is safe by design: a killed controller leaves the nodes running and the
ledger consistent, for the one that holds the lease.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from orchestrator.config import Settings
from orchestrator.control.machine_id import holder_id, machine_id
from orchestrator.errors import OrchError
from orchestrator.ledger.controller_leases import ControllerLeases, LeaseClaim
from orchestrator.ledger.store import Ledger, utcnow

LEASE_LOST = "LEASE_LOST"  # the event a controller writes when it stops for a lost lease
LEASE_TAKEN_OVER = "LEASE_TAKEN_OVER"  # the event of a controller adopting an expired lease
LOST_EXIT_CODE = 1  # the exit status of a controller that stopped for a lost lease

OnLost = Callable[[str], None]  # called with why; the default ends the process


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
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.ledger = ledger
        self.job_id = job_id
        self.machine = machine_id(settings.home)
        self.holder = holder_id(self.machine)
        self.length_s = settings.ledger.controller_lease
        self.every_s = settings.ledger.lease_renewal
        self.leases = ControllerLeases(ledger)
        self._on_lost = on_lost or self._stop_process
        self._clock = clock
        self._expires: datetime | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> LeaseClaim:
        """Take the lease (the caller holds the job's controller lock here); the claim says
        whether it is ours, else whose it is. A lease taken over from another holder is
        written as a LEASE_TAKEN_OVER event."""
        now = self._clock()
        claim = self.leases.take(
            self.job_id, self.holder, self.machine, now=now, length_s=self.length_s,
            dead_on_this_machine=True,
        )  # fmt: skip
        if claim.taken:
            self._expires = now + timedelta(seconds=self.length_s)
            if claim.previous is not None:
                previous = claim.previous
                self.ledger.add_event(
                    self.job_id, LEASE_TAKEN_OVER,
                    f"controller {self.holder} took over the lease of {previous.holder} "
                    f"(machine {previous.machine}), which was not renewed after "
                    f"{previous.renewed_at.isoformat(timespec='seconds')}",
                )  # fmt: skip
        return claim

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
        default the process ends there) and False returned."""
        now = self._clock()
        try:
            held = self.leases.renew(self.job_id, self.holder, now=now, length_s=self.length_s)
        except (SQLAlchemyError, OrchError) as exc:
            if self._expires is not None and now + timedelta(seconds=self.every_s) < self._expires:
                return True  # try again next turn, while the lease still runs
            self._lost(f"the ledger did not answer its renewals before its lease expired ({exc})")
            return False
        if held:
            self._expires = now + timedelta(seconds=self.length_s)
            return True
        current = self.leases.get(self.job_id)
        taker = f"{current.holder} (machine {current.machine})" if current else "nobody"
        self._lost(f"its lease expired and is now held by {taker}")
        return False

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.every_s):
            if not self.renew():
                return

    def _lost(self, why: str) -> None:
        message = (
            f"controller {self.holder} stopped driving the job: {why}; it left the job's nodes "
            "as they were, to the lease's holder"
        )
        with contextlib.suppress(SQLAlchemyError, OrchError):
            self.ledger.add_event(self.job_id, LEASE_LOST, message)
        self._expires = None
        self._on_lost(message)

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
