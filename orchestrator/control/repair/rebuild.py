"""A job whose ledger died with its controller host, rebuilt from what outlived it.

The laptop hands the job's kit (record, secrets file, node key: `host.handover`, and the
figures it kept of the job: `control.repair.carried`) to the new host; the provider still lists the
job's nodes by their tags (job, cluster, rank, market, type, price, launch time, the id of the
ledger that launched them). From both, `rebuild` writes the job into this ledger as RUNNING,
with one lease per node and a REBUILT event, and takes on the dead ledger's id
(`ledger.rebuilt`). The next revival gives it a controller, which adopts it on its nodes as
after a crash: training goes on, ranks found gone are replaced.

The job keeps its limits: its start, recoveries and every lease the kit's figures list (ended
ones closed when they ended; ones open then but not running now, closed at the figures' time)
are written too, so max_runtime counts from the job's first start and the spend is the whole
bill, not a fresh one. What died with the old ledger stays lost and is said in the REBUILT
event: its earlier events and checkpoint records, and the bill of nodes the figures do not
list (all but the running nodes' when the kit has no figures: then the bill starts from the
running nodes' launch, and max_runtime from the oldest's). A job none of whose nodes runs any
more is not rebuilt: whether it finished cannot be known, and starting it again could run it
twice; it is reported lost, with what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from orchestrator.config import Settings
from orchestrator.control.process.controllers import controller_identity, load_job_record
from orchestrator.control.process.liveness import JOB_RECORD, JOB_SECRETS
from orchestrator.control.repair.carried import CARRIED, Carried, CarriedLease, from_json
from orchestrator.errors import OrchError, UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.measures import total_cost
from orchestrator.ledger.rebuilt import REBUILT_EVENT, write_rebuilt_job
from orchestrator.ledger.store import Event, Job, Lease, Ledger, utcnow
from orchestrator.providers.base import Instance, Provider
from orchestrator.spec.model import LoadedJob

Status = Literal["known", "rebuilt", "lost"]


@dataclass(frozen=True)
class Rebuilt:
    """What `rebuild` did with one job."""

    job_id: str
    status: Status  # known: the ledger had it; rebuilt: written now; lost: cannot be driven
    detail: str  # what was written, or why it is lost


@dataclass(frozen=True)
class Rows:
    """The rows that make a rebuilt job, and the ledger id its nodes carry (None: none)."""

    job: Job
    leases: list[Lease]
    events: list[Event]
    ledger_id: str | None


class NotRebuildable(OrchError):
    """The job cannot be rebuilt from its nodes (the message says why)."""


def rebuilt_rows(
    loaded: LoadedJob,
    job_id: str,
    instances: list[Instance],
    *,
    provider: str,
    submitted_at: datetime,
    controller: str,
    owner: str | None,
    now: datetime,
    carried: Carried | None = None,
    carried_problem: str | None = None,
) -> Rows:
    """The job of `loaded` as RUNNING on `instances` (its nodes as the provider lists them),
    with the start, recoveries and leases of `carried` (the figures the kit kept; None: none,
    and `carried_problem` says why when they were unreadable); `submitted_at`: when its record
    was written. Raises `NotRebuildable` when no node runs or the nodes carry the ids of
    several ledgers."""
    if not instances:
        raise NotRebuildable(
            f"no node of job {job_id} runs any more (they ended while it had no controller: "
            "their guards' lease ran out, or the cloud took them), and whether it finished "
            "died with the host's ledger",
            hint="look at its checkpoints (its checkpoint store, if it had one) and submit it "
            "again",
        )
    ledger_ids = {i.ledger_id for i in instances} - {None}
    if len(ledger_ids) > 1:
        raise NotRebuildable(
            f"the nodes of job {job_id} carry the ids of several ledgers "
            f"({', '.join(sorted(str(x) for x in ledger_ids))}): which to drive is not known",
            hint="end the nodes that are not the job's (`orch reconcile` on their ledger), "
            "then run `orch controller up` again",
        )
    spec = loaded.spec
    started = min(i.launched_at for i in instances)
    if carried is not None and carried.started_at is not None:
        started = carried.started_at
    job = Job(
        id=job_id,
        name=spec.name,
        state=JobState.RUNNING,
        provider=provider,
        nodes=spec.resources.nodes,
        gpus_per_node=spec.resources.gpus_per_node,
        spec_json=json.dumps(spec.public_document()),
        spec_path=str(loaded.source),
        created_at=min(submitted_at, started),
        started_at=started,
        controller=controller,
        owner=owner,
        recoveries=carried.recoveries if carried is not None else 0,
    )
    leases = [
        Lease.from_instance(i, job_id=job_id, provider=provider, identity=None)
        for i in sorted(instances, key=lambda i: (i.rank, i.launched_at))
    ]
    running = {i.instance_id for i in instances}
    ended: list[CarriedLease] = []
    if carried is not None:
        ended = [c for c in carried.leases if c.instance_id not in running]
        leases += [ended_lease(c, job_id, provider, carried.as_of) for c in ended]
    ranks = ", ".join(str(i.rank) for i in sorted(instances, key=lambda i: i.rank))
    message = (
        f"rebuilt on a new controller host from its {len(instances)} running node(s) "
        f"(ranks {ranks}): its ledger died with the old host, and with it the job's earlier "
        "events and checkpoint records; "
    )
    if carried is None:
        message += (
            "its hand-over kit holds no figures of it"
            + (f" ({carried_problem})" if carried_problem else "")
            + ", so the recoveries and the bill of nodes that ended before are lost too: the "
            "bill goes on from the running nodes' launch, and max_runtime counts from the "
            "oldest's"
        )
    else:
        message += carried_words(carried, ended, leases)
    event = Event(job_id=job_id, at=now, kind=REBUILT_EVENT, message=message)
    return Rows(job, leases, [event], next(iter(ledger_ids), None))


def ended_lease(lease: CarriedLease, job_id: str, provider: str, as_of: datetime) -> Lease:
    """The lease of a node the figures list that runs no more: closed when it ended, or at
    the figures' time when it was still billing then (its end after that is not known)."""
    return Lease(
        job_id=job_id, cluster=lease.cluster, provider=provider, instance_id=lease.instance_id,
        rank=lease.rank, market=lease.market, instance_type=lease.instance_type,
        price_per_hour=lease.price_per_hour, launched_at=lease.launched_at,
        ended_at=lease.ended_at or max(as_of, lease.launched_at), identity=None,
    )  # fmt: skip


def carried_words(carried: Carried, ended: list[CarriedLease], leases: list[Lease]) -> str:
    """What the REBUILT event says was carried over from the kit's figures."""
    started = carried.started_at.isoformat() if carried.started_at else "not started"
    words = (
        f"carried over from the figures in its hand-over kit, as of {carried.as_of.isoformat()}: "
        f"its first start ({started}), {carried.recoveries} "
        f"{'recovery' if carried.recoveries == 1 else 'recoveries'} and {len(ended)} lease(s) "
        f"of nodes that run no more; the bill then was ${total_cost(leases, carried.as_of):.4f}"
    )
    gone = [c.instance_id for c in ended if c.ended_at is None]
    if gone:
        words += (
            f"; node(s) {', '.join(gone)} still billed then and run no more: billed until then, "
            "their end is not known"
        )
    return words


def rebuild(
    settings: Settings, ledger: Ledger, job_id: str, provider_named: Callable[[str], Provider]
) -> Rebuilt:
    """Write `job_id` into `ledger` from its kit in this ORCH_HOME and its running nodes, as the
    provider its spec names (`provider_named`) lists them; see the module docstring. A job the
    ledger knows is left as it is ("known"); one that cannot be driven from here is "lost",
    with why. Ends no node and launches none."""
    try:
        ledger.get_job(job_id)
        return Rebuilt(job_id, "known", "the ledger has it")
    except UnknownJob:
        pass
    job_dir = settings.job_dir(job_id)
    if not (job_dir / JOB_RECORD).is_file() or not (job_dir / JOB_SECRETS).is_file():
        return Rebuilt(job_id, "lost", "this host has no hand-over kit of it")
    if not settings.keys_dir(job_id).is_dir():
        return Rebuilt(job_id, "lost", "its hand-over kit lacks its nodes' SSH key")
    carried, problem = kept_figures(job_dir / CARRIED, job_id)
    try:
        loaded = load_job_record(settings, job_id)
        provider = provider_named(loaded.spec.provider)
        instances = provider.list_owned(job_id=job_id)
        submitted_at = datetime.fromtimestamp((job_dir / JOB_RECORD).stat().st_mtime, UTC)
        rows = rebuilt_rows(
            loaded, job_id, instances,
            provider=provider.name, submitted_at=submitted_at,
            controller=controller_identity(), owner=settings.owner_label, now=utcnow(),
            carried=carried, carried_problem=problem,
        )  # fmt: skip
        write_rebuilt_job(ledger, rows.job, rows.leases, rows.events, ledger_id=rows.ledger_id)
    except OrchError as exc:
        return Rebuilt(job_id, "lost", exc.message if exc.hint is None else
                       f"{exc.message} ({exc.hint})")  # fmt: skip
    except (OSError, ValueError) as exc:
        return Rebuilt(job_id, "lost", f"its hand-over kit is unreadable: {exc}")
    return Rebuilt(job_id, "rebuilt", f"RUNNING on {len(rows.leases)} node(s)")


def kept_figures(path: Path, job_id: str) -> tuple[Carried | None, str | None]:
    """The figures kept at `path` (None: none), and why they could not be read (None: read,
    or there are none)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"its figures are unreadable: {exc}"
    try:
        return from_json(text, job_id), None
    except ValueError as exc:
        return None, f"its figures are refused: {exc}"
