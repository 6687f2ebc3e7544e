"""Find and end what no live job owns: nodes of finished, unknown or orphaned jobs.

A job is orphaned when it is not final but the process recorded as its controller is gone
(killed, machine rebooted). Its nodes are terminated, its open leases closed at the time the
provider acknowledged, and the job is marked FAILED with the reason.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from orchestrator.ledger import Job, JobState, Ledger, utcnow
from orchestrator.providers.base import Provider


def controller_alive(controller: str | None) -> bool:
    """Whether the `host:pid` recorded for a job still runs (on this host). Unknown -> False."""
    if not controller or ":" not in controller:
        return False
    host, _, pid_text = controller.rpartition(":")
    if host != os.uname().nodename:
        return True  # another machine's controller: not ours to judge
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def job_is_live(job: Job | None) -> bool:
    return job is not None and not JobState(job.state).is_final and controller_alive(job.controller)


@dataclass
class ReconcileReport:
    terminated: dict[str, list[str]] = field(default_factory=dict)  # job id -> instance ids
    orphaned_jobs: list[str] = field(default_factory=list)  # marked FAILED


def end_nodes(ledger: Ledger, provider: Provider, job_id: str, instance_ids: list[str]) -> None:
    """Terminate nodes and close their leases at the provider's acknowledged end time."""
    ended_at = provider.terminate(sorted(instance_ids))
    ledger.close_leases(instance_ids, ended_at)
    if any(j.id == job_id for j in ledger.jobs()):
        ledger.add_event(job_id, "TERMINATED", f"{len(instance_ids)} node(s) by reconcile")


def reconcile(ledger: Ledger, providers: list[Provider]) -> ReconcileReport:
    """End every node whose job is not live; mark orphaned jobs FAILED. Idempotent."""
    report = ReconcileReport()
    jobs = {job.id: job for job in ledger.jobs()}
    for provider in providers:
        by_job: dict[str, list[str]] = defaultdict(list)
        for instance in provider.list_owned():
            by_job[instance.job_id].append(instance.instance_id)
        for job_id, ids in by_job.items():
            if job_is_live(jobs.get(job_id)):
                continue
            end_nodes(ledger, provider, job_id, ids)
            report.terminated[job_id] = sorted(ids)
    for job in jobs.values():
        if JobState(job.state).is_final or controller_alive(job.controller):
            continue
        open_ids = [lease.instance_id for lease in ledger.leases(job.id, open_only=True)]
        ledger.close_leases(open_ids, utcnow())
        ledger.update_job(
            job.id,
            state=JobState.FAILED,
            ended_at=utcnow(),
            exit_code=1,
            reason="its controller stopped without finishing the job (nodes ended by reconcile)",
        )
        ledger.add_event(job.id, "FAILED", "controller lost; reconciled")
        report.orphaned_jobs.append(job.id)
    return report
