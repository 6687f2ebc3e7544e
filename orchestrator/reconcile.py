"""Make the world match the ledger: every unfinished job driven, no node left unowned.

An unfinished job whose controller died gets a new, detached controller that adopts it (its
training never stopped). Nodes of finished or unknown jobs are terminated and their leases
closed at the time the provider acknowledged.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field

from orchestrator.config import Settings
from orchestrator.errors import UnknownJob
from orchestrator.ledger import JobState, Ledger
from orchestrator.providers.base import Provider
from orchestrator.supervision import controller_running, revive_controllers


@dataclass
class ReconcileReport:
    terminated: dict[str, list[str]] = field(default_factory=dict)  # job id -> instance ids
    revived: list[str] = field(default_factory=list)  # jobs given a new controller


def end_nodes(ledger: Ledger, provider: Provider, job_id: str, instance_ids: list[str]) -> None:
    """Terminate nodes and close their leases at the provider's acknowledged end time."""
    ended_at = provider.terminate(sorted(instance_ids))
    ledger.close_leases(instance_ids, ended_at)
    with contextlib.suppress(UnknownJob):  # nodes of a job the ledger never knew
        ledger.add_event(ledger.get_job(job_id).id, "TERMINATED", f"{len(instance_ids)} node(s)")


def reconcile(
    settings: Settings, ledger: Ledger, providers: list[Provider], *, dry_run: bool = False
) -> ReconcileReport:
    """Revive lost controllers, then end every node no driven job owns. Idempotent.

    With `dry_run`, nothing is revived or terminated: the report says what would be.
    """
    if dry_run:
        revived = [
            job.id
            for job in ledger.jobs()
            if not JobState(job.state).is_final and not controller_running(settings, job.id)
        ]
    else:
        revived = revive_controllers(settings, ledger)
    report = ReconcileReport(revived=revived)
    jobs = {job.id: job for job in ledger.jobs()}
    for provider in providers:
        by_job: dict[str, list[str]] = defaultdict(list)
        for instance in provider.list_owned():
            by_job[instance.job_id].append(instance.instance_id)
        for job_id, ids in by_job.items():
            job = jobs.get(job_id)
            driven = job_id in report.revived or controller_running(settings, job_id)
            if job is not None and not JobState(job.state).is_final and driven:
                continue
            if not dry_run:
                end_nodes(ledger, provider, job_id, ids)
            report.terminated[job_id] = sorted(ids)
    return report
