"""Make the world match the ledger: every unfinished job driven, no node left unowned.

An unfinished job whose controller died gets a new, detached controller that adopts it (its
training never stopped). Nodes of this ledger (`control.process.ownership`) whose job is finished
or unknown are terminated and their leases closed at the time the provider acknowledged; a
node of a known job that has no lease (its launch was cut short before the lease was written)
gets one first, so its seconds are billed. Nodes of another ledger, or with no ledger tag and
no lease here, are reported as not ours and never touched.

A shared ledger (`LedgerSettings.shared`) has one ledger id for every machine that uses it,
so "ours" says nothing about which machine drives a job: the nodes of an unfinished job that
another machine's controller drives, or that only another machine can drive
(`control.process.adoption`), are never ended from here, only reported; and another machine's kept
clusters are never settled (recorded DOWN when this machine sees none of their nodes) or ended.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from orchestrator.config import Settings
from orchestrator.control.process.adoption import Stranded, plan_adoption
from orchestrator.control.process.controllers import controller_running, revive
from orchestrator.control.process.ownership import partition
from orchestrator.control.run.end_nodes import (
    end_nodes,
)
from orchestrator.control.run.kept_turn import cluster_scope, is_mine, settle
from orchestrator.control.run.unrecorded import (
    finish_unrecorded,
)
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import Ledger
from orchestrator.providers.base import Provider


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
