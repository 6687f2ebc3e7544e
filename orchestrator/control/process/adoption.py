"""Which unfinished jobs need a new controller from this ORCH_HOME, and which are another
machine's to drive. Decisions only: `supervision.revive` starts the controllers.

On this ORCH_HOME's own ledger (the SQLite file), a job needs a controller when none holds its
lock and its record is here (`liveness.controller_lost`). On a shared ledger
(`LedgerSettings.shared`), where jobs of other machines show too, each unfinished job is:

- driven here: a process of this ORCH_HOME holds its controller lock; nothing to do;
- live elsewhere: another machine's controller holds an unexpired lease on it (or it was
  registered elsewhere a moment ago and its controller is starting); never revived, its nodes
  never touched from here;
- this machine's (its lease, or else the `machine:pid` that registered it, names this
  machine): revived as on a ledger of its own, since no process holds its lock;
- adoptable: its controller on another machine stopped (lease expired) and this ORCH_HOME
  has what driving it takes: the job record and its secrets file (`jobs/<id>/job.json`,
  `env.json`) and, once it launched nodes, their SSH keys (`keys/<node owner>`); revived;
- stranded: its controller stopped on a machine that holds what this one lacks; reported
  (`Stranded.line`), never revived, its nodes never touched from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from orchestrator.config import Settings
from orchestrator.control.process.liveness import (
    JOB_RECORD,
    JOB_SECRETS,
    controller_lost,
    lock_held,
)
from orchestrator.control.process.machine_id import machine_id, machine_of
from orchestrator.job_state import JobState
from orchestrator.ledger.view import LedgerView

if TYPE_CHECKING:
    from orchestrator.ledger.rows import JobRow
    from orchestrator.ledger.store import Job, Ledger


@dataclass(frozen=True)
class Stranded:
    """An unfinished job whose controller stopped on another machine, which this one cannot
    drive (it lacks the job's record, secrets or keys)."""

    job_id: str
    machine: str | None  # where its controller ran; None: unknown

    def line(self) -> str:
        """What a command says about it, e.g. "job J: its controller on machine M stopped;
        run `orch reconcile` on M, which holds its keys"."""
        if self.machine is None:
            return (
                f"job {self.job_id}: its controller on another machine stopped; run "
                "`orch reconcile` on the machine that submitted it, which holds its keys"
            )
        return (
            f"job {self.job_id}: its controller on machine {self.machine} stopped; run "
            f"`orch reconcile` on {self.machine}, which holds its keys"
        )


@dataclass
class Adoption:
    """What this ORCH_HOME does about the unfinished jobs it looked at."""

    revive: list[str] = field(default_factory=list)  # give each a controller here
    live_elsewhere: list[str] = field(default_factory=list)  # driven by another machine
    stranded: list[Stranded] = field(default_factory=list)  # another machine's to revive

    @property
    def hands_off(self) -> set[str]:
        """Jobs this ORCH_HOME must not touch: not revived, their nodes never ended."""
        return set(self.live_elsewhere) | {s.job_id for s in self.stranded}


def can_drive_here(settings: Settings, ledger: Ledger | LedgerView, job: Job | JobRow) -> bool:
    """Whether this ORCH_HOME holds what driving `job` takes: its record and secrets file,
    and its nodes' SSH keys once it launched any."""
    job_dir = settings.job_dir(job.id)
    if not (job_dir / JOB_RECORD).is_file() or not (job_dir / JOB_SECRETS).is_file():
        return False
    return settings.keys_dir(job.node_owner).is_dir() or not ledger.leases(job.id)


def plan_adoption(
    settings: Settings,
    ledger: Ledger | LedgerView,
    jobs: Iterable[Job | JobRow],
    *,
    now: datetime | None = None,
) -> Adoption:
    """Sort the unfinished ones of `jobs` as the module docstring says; final jobs are left
    out. `now`: the time leases are judged at (UTC); by default the ledger's clock, the one
    every machine judges leases by (`ledger.clock`). `ledger` is the SQLModel ledger, or its
    read model (`ledger.view`: the same reads, as rows, in one snapshot)."""
    unfinished = [job for job in jobs if not JobState(job.state).is_final]
    adoption = Adoption()
    if not settings.ledger.shared:
        adoption.revive = [j.id for j in unfinished if controller_lost(settings.job_dir(j.id))]
        return adoption
    if not unfinished:
        return adoption
    if isinstance(ledger, LedgerView):
        now = now or ledger.clock()  # before the leases: never judged too late
        leases = ledger.controller_leases()
    else:
        from orchestrator.ledger.controller_leases import ControllerLeases

        now = now or ControllerLeases(ledger).now()  # before the leases, as above
        leases = ControllerLeases(ledger).all()  # type: ignore[assignment]
    me = machine_id(settings.home)
    starting = timedelta(seconds=settings.ledger.controller_lease)
    for job in unfinished:
        job_dir = settings.job_dir(job.id)
        if lock_held(job_dir):
            continue  # driven here
        lease = leases.get(job.id)
        machine = lease.machine if lease is not None else machine_of(job.controller)
        if lease is not None and lease.expires_at > now and lease.machine != me:
            adoption.live_elsewhere.append(job.id)
        elif machine == me:
            if controller_lost(job_dir):
                adoption.revive.append(job.id)
        elif can_drive_here(settings, ledger, job):
            adoption.revive.append(job.id)
        elif lease is None and job.created_at > now - starting:
            adoption.live_elsewhere.append(job.id)  # its controller is taking its first lease
        else:
            adoption.stranded.append(Stranded(job.id, machine))
    return adoption
