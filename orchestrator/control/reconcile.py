"""Make the world match the ledger: every unfinished job driven, no node left unowned.

An unfinished job whose controller died gets a new, detached controller that adopts it (its
training never stopped). Nodes of this ledger (`control.ownership`) whose job is finished
or unknown are terminated and their leases closed at the time the provider acknowledged; a
node of a known job that has no lease (its launch was cut short before the lease was written)
gets one first, so its seconds are billed. Nodes of another ledger, or with no ledger tag and
no lease here, are reported as not ours and never touched.

A shared ledger (`LedgerSettings.shared`) has one ledger id for every machine that uses it,
so "ours" says nothing about which machine drives a job: the nodes of an unfinished job that
another machine's controller drives, or that only another machine can drive
(`control.adoption`), are never ended from here, only reported; and another machine's kept
clusters are never settled (recorded DOWN when this machine sees none of their nodes) or ended.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.control.adoption import Stranded, plan_adoption
from orchestrator.control.kept import cluster_scope, is_mine, settle
from orchestrator.control.ownership import partition
from orchestrator.control.supervision import controller_running, revive
from orchestrator.control.unrecorded import (
    LEDGER_FAILURES,
    DeferredWrites,
    UnrecordedEnd,
    finish_unrecorded,
    save_unrecorded,
)
from orchestrator.errors import LedgerError, OrchError, UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import Lease, Ledger
from orchestrator.providers.base import Instance, Provider


@dataclass
class ReconcileReport:
    terminated: dict[str, list[str]] = field(default_factory=dict)  # job id -> instance ids
    revived: list[str] = field(default_factory=list)  # jobs given a new controller
    not_ours: list[str] = field(default_factory=list)  # ids of other ledgers' nodes: untouched
    recorded: list[str] = field(default_factory=list)  # jobs whose unwritten stop was written
    # on a shared ledger: jobs another machine's controller drives (untouched), and jobs whose
    # controller stopped on another machine that holds their keys (untouched, to be revived
    # there: `Stranded.line`)
    live_elsewhere: list[str] = field(default_factory=list)
    stranded: list[Stranded] = field(default_factory=list)
    nodes: int = 0  # this ledger's nodes the providers listed as running, ended ones included


def lease_unrecorded(
    ledger: Ledger,
    provider: Provider,
    job_id: str,
    instance_ids: Iterable[str],
    *,
    known: Iterable[Instance] = (),
) -> list[str]:
    """Open a lease for each of these nodes of job `job_id` that has none; returns their ids.

    Such a node was launched by a controller that died before it wrote the lease. Its lease
    starts at the node's launch time, at the price the provider recorded at launch. Nodes are
    described from `known`, else asked of the provider; a job the ledger does not know gets no
    lease (there is nothing to bill it to).
    """
    try:
        ledger.get_job(job_id)
    except UnknownJob:
        return []
    missing = set(instance_ids) - {lease.instance_id for lease in ledger.leases(job_id)}
    if not missing:
        return []
    described = {i.instance_id: i for i in known}
    if not missing <= described.keys():
        described.update({i.instance_id: i for i in provider.list_owned(job_id=job_id)})
    leased = []
    for instance in (described[iid] for iid in sorted(missing) if iid in described):
        ledger.open_lease(
            Lease.from_instance(
                instance, job_id=job_id, provider=provider.name, identity=identity_json(provider)
            )
        )
        ledger.add_event(
            job_id, "LEASED", f"node {instance.rank}: {instance.instance_id} ran without a lease "
            f"(its launch was cut short); billed from its launch at ${instance.price_per_hour}/h",
        )  # fmt: skip
        leased.append(instance.instance_id)
    return leased


def identity_json(provider: Provider) -> str | None:
    """The provider's identity as a lease records it; None when the cloud cannot say."""
    try:
        return provider.identity().to_json()
    except OrchError:
        return None


def hold_fence(ledger: Ledger, count: int, report: Callable[[str], None]) -> None:
    """Right before a provider's terminate: on a fenced ledger (`ledger.fencing`), check the
    caller's controller lease and renew it for its length, so that no controller takes it
    over by expiry before the terminate went out. `LeaseLost` when it is another's: end
    nothing. A ledger that does not answer does not hold the nodes up (it never does at a
    termination): `report` says so and the nodes are ended; callers whose ledger already
    refused a write skip the check (the controller's renewal thread stops it before its
    lease could run out).

    What is left: a process paused for longer than a lease between this check and the
    provider's call sends the call when it resumes, after another controller may have taken
    the lease over (nothing between the ledger and the cloud can take back a call in flight)."""
    try:
        ledger.hold_fence(f"end {count} node(s)")
    except LEDGER_FAILURES as exc:
        report(f"[orch] could not check the controller lease before ending nodes ({exc}); "
               "ending them")  # fmt: skip


def end_nodes(
    ledger: Ledger,
    provider: Provider,
    job_id: str,
    instance_ids: list[str],
    *,
    home: Path | None = None,
) -> None:
    """Terminate nodes and close their leases at the provider's acknowledged end time (nodes
    without a lease get one first: `lease_unrecorded`).

    The termination never waits on the ledger: its writes are best effort, tried once more
    after the nodes ended. What the ledger still refuses is saved under `home`/unrecorded/
    (ORCH_HOME; `finish_unrecorded` writes it later) and `LedgerError` is raised, the nodes
    being gone by then.
    """
    lines: list[str] = []
    writes = DeferredWrites(lines.append)
    with contextlib.suppress(OrchError):  # cannot describe them: they end unleased
        writes.write(
            "leases of nodes launched without one",
            lambda: lease_unrecorded(ledger, provider, job_id, instance_ids),
        )
    if writes.error is None:  # a ledger that refused a write is not waited on again
        hold_fence(ledger, len(instance_ids), lines.append)
    ended_at = provider.terminate(sorted(instance_ids))
    writes.write("the end of their leases", lambda: ledger.close_leases(instance_ids, ended_at))

    def event() -> None:
        with contextlib.suppress(UnknownJob):  # nodes of a job the ledger never knew
            ledger.add_event(
                ledger.get_job(job_id).id, "TERMINATED", f"{len(instance_ids)} node(s)"
            )

    writes.write("the TERMINATED event", event)
    left = writes.retry()
    if not left:
        return
    ended = f"{', '.join(sorted(instance_ids))} ended at {ended_at.isoformat()}"
    kept = "not kept (no ORCH_HOME given)"
    if home is not None:
        record = UnrecordedEnd(job_id, [(sorted(instance_ids), ended_at)])
        try:
            kept = f"kept in {save_unrecorded(home, record)}"
        except OSError as exc:
            kept = f"not kept ({exc})"
    raise LedgerError(
        f"{job_id}: nodes {ended}, but the ledger refused writes ({writes.error}); "
        f"not written: {'; '.join(left)}; {kept}",
        hint="free the ledger (disk space, the process holding its lock), then run "
        "`orch reconcile`: it closes the leases at the time above",
    )


def reconcile(
    settings: Settings, ledger: Ledger, providers: list[Provider], *, dry_run: bool = False
) -> ReconcileReport:
    """Revive lost controllers, then end every node of this ledger that no driven job owns
    (on a shared ledger: nor another machine's unfinished job). Idempotent. Nodes that are
    not this ledger's are only listed (`ReconcileReport.not_ours`).

    The nodes are listed before anything is read about their jobs (which jobs there are,
    their state, who drives them, their leases, the kept clusters). A job is registered
    before its nodes launch (intent first), so every listed node's job is in what is read
    after: a job a teammate registers while reconcile runs is seen as theirs with its nodes,
    or its nodes launched after the listing and are not looked at. Neither is ended.

    With `dry_run`, nothing is revived or terminated: the report says what would be.
    Records a stop could not write (ORCH_HOME/unrecorded/) are written first.
    """
    recorded = [] if dry_run else finish_unrecorded(settings.home, ledger)
    if not dry_run:  # another machine's cluster is its to settle: it sees its nodes
        scope = cluster_scope(settings)
        kept = [c for c in Clusters(ledger).all(up_only=True) if is_mine(c, scope)]
        for provider in providers:
            for cluster in (c for c in kept if c.provider == provider.name):
                settle(ledger, provider, cluster)
    listed = [(provider, provider.list_owned()) for provider in providers]  # first: see above
    if dry_run:
        adoption = plan_adoption(settings, ledger, ledger.jobs())
        if not settings.ledger.shared:  # as before: every unfinished job without a controller
            adoption.revive = [
                job.id
                for job in ledger.jobs()
                if not JobState(job.state).is_final and not controller_running(settings, job.id)
            ]
    else:
        adoption = revive(settings, ledger)
    report = ReconcileReport(
        revived=adoption.revive,
        recorded=recorded,
        live_elsewhere=sorted(adoption.live_elsewhere),
        stranded=adoption.stranded,
    )
    hands_off = adoption.hands_off
    jobs = {job.id: job for job in ledger.jobs()}
    leased = {lease.instance_id for lease in ledger.leases()}
    kept_ids = {c.id for c in Clusters(ledger).all(up_only=True)}
    for provider, instances in listed:
        found = partition(instances, ledger.ledger_id, leased=leased)
        report.not_ours.extend(i.instance_id for i in found.others)
        report.nodes += len(found.ours)
        by_job: dict[str, list[str]] = defaultdict(list)
        for instance in found.ours:
            by_job[instance.job_id].append(instance.instance_id)
        for job_id, ids in by_job.items():
            if job_id in kept_ids:  # a kept cluster's: it stays up until down or autostop
                continue
            job = jobs.get(job_id)
            driven = job_id in report.revived or controller_running(settings, job_id)
            if job is not None and not JobState(job.state).is_final and driven:
                continue
            if job_id in hands_off and job is not None and not JobState(job.state).is_final:
                continue  # another machine's to drive (or revive): never ended from here
            if not dry_run:
                end_nodes(ledger, provider, job_id, ids, home=settings.home)
            report.terminated[job_id] = sorted(ids)
    report.not_ours.sort()
    return report
