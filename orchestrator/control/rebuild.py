"""A job whose ledger died with its controller host, rebuilt from what outlived it.

The laptop hands the job's kit (record, secrets file, node key: `host.handover`) to the new
host; the provider still lists the job's nodes by their tags (job, cluster, rank, market, type,
price, launch time, the id of the ledger that launched them). From both, `rebuild` writes the
job into this ledger as RUNNING, with one lease per node and a REBUILT event, and takes on the
dead ledger's id (`ledger.rebuilt`). The next revival gives it a controller, which adopts it on
its nodes as after a crash: training goes on, ranks found gone are replaced.

What died with the old ledger stays lost and is said in the REBUILT event: its earlier events,
checkpoint records and recoveries, and the bill of nodes that ended before the hand-over (the
bill starts from the running nodes' launch, at the prices they were launched at). A job none of
whose nodes runs any more is not rebuilt: whether it finished cannot be known, and starting it
again could run it twice; it is reported lost, with what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from orchestrator.config import Settings
from orchestrator.control.liveness import JOB_RECORD, JOB_SECRETS
from orchestrator.control.supervision import controller_identity, load_job_record
from orchestrator.errors import OrchError, UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.rebuilt import write_rebuilt_job
from orchestrator.ledger.store import Event, Job, Lease, Ledger, utcnow
from orchestrator.providers.base import Instance, Provider
from orchestrator.spec.model import LoadedJob

REBUILT_EVENT = "REBUILT"

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
) -> Rows:
    """The job of `loaded` as RUNNING on `instances` (its nodes as the provider lists them);
    `submitted_at`: when its record was written. Raises `NotRebuildable` when no node runs
    or the nodes carry the ids of several ledgers."""
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
    )
    leases = [
        Lease.from_instance(i, job_id=job_id, provider=provider, identity=None)
        for i in sorted(instances, key=lambda i: (i.rank, i.launched_at))
    ]
    ranks = ", ".join(str(i.rank) for i in sorted(instances, key=lambda i: i.rank))
    message = (
        f"rebuilt on a new controller host from its {len(instances)} running node(s) "
        f"(ranks {ranks}): its ledger died with the old host, and with it the job's earlier "
        "events, checkpoint records, recoveries and the bill of nodes that ended before; the "
        "bill goes on from the running nodes' launch"
    )
    event = Event(job_id=job_id, at=now, kind=REBUILT_EVENT, message=message)
    return Rows(job, leases, [event], next(iter(ledger_ids), None))


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
    try:
        loaded = load_job_record(settings, job_id)
        provider = provider_named(loaded.spec.provider)
        instances = provider.list_owned(job_id=job_id)
        submitted_at = datetime.fromtimestamp((job_dir / JOB_RECORD).stat().st_mtime, UTC)
        rows = rebuilt_rows(
            loaded, job_id, instances,
            provider=provider.name, submitted_at=submitted_at,
            controller=controller_identity(), owner=settings.owner_label, now=utcnow(),
        )  # fmt: skip
        write_rebuilt_job(ledger, rows.job, rows.leases, rows.events, ledger_id=rows.ledger_id)
    except OrchError as exc:
        return Rebuilt(job_id, "lost", exc.message if exc.hint is None else
                       f"{exc.message} ({exc.hint})")  # fmt: skip
    except (OSError, ValueError) as exc:
        return Rebuilt(job_id, "lost", f"its hand-over kit is unreadable: {exc}")
    return Rebuilt(job_id, "rebuilt", f"RUNNING on {len(rows.leases)} node(s)")
