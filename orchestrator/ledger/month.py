"""What the monthly budgets read of the ledger (`orchestrator.control.money.team_budget`): every
node
lease and kept cluster idle lease that may bill in a month, every live job, whom each is billed
to, and the planned costs recorded at submit. A handful of queries, whatever the ledger's age:
leases that ended before the month are never read, except those of jobs still live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, or_, select

from orchestrator.job_state import FINAL_STATES
from orchestrator.ledger.store import Event, IdleLease, Job, Lease, Ledger


@dataclass(frozen=True)
class MonthRows:
    """The rows a monthly budget is worked out from."""

    leases: list[Lease]  # billing at or after `since`, and every lease of a live job
    idle_leases: list[IdleLease]  # kept clusters' idle leases billing at or after `since`
    owners: dict[str, str | None]  # job id -> owner label, for every job of `leases`
    cluster_owners: dict[str, str | None]  # kept cluster id -> owner of its latest job
    live: list[Job]  # jobs not in a final state
    events: dict[str, list[str]] = field(default_factory=dict)  # live job id -> messages of
    #   its events of the kind asked for (the planned cost recorded at submit)


def month_rows(ledger: Ledger, since: datetime, *, event_kind: str) -> MonthRows:
    """The rows of leases that bill at or after `since` (open, or ended after it), of live
    jobs (all their leases, to know what they spent), and of whom they are billed to."""
    finals = [str(state) for state in FINAL_STATES]
    with Session(ledger.engine) as session:
        live = list(session.exec(select(Job).where(col(Job.state).not_in(finals))))
        live_ids = [job.id for job in live]
        billing = or_(col(Lease.ended_at).is_(None), col(Lease.ended_at) > since)
        where = or_(billing, col(Lease.job_id).in_(live_ids)) if live_ids else billing
        leases = list(session.exec(select(Lease).where(where).order_by(col(Lease.id))))
        job_ids = sorted({lease.job_id for lease in leases} | set(live_ids))
        owners: dict[str, str | None] = {}
        if job_ids:
            query = select(Job.id, Job.owner).where(col(Job.id).in_(job_ids))
            owners = {job_id: owner for job_id, owner in session.exec(query)}
        idle = list(
            session.exec(
                select(IdleLease).where(
                    or_(col(IdleLease.ended_at).is_(None), col(IdleLease.ended_at) > since)
                )
            )
        )
        cluster_owners: dict[str, str | None] = {}
        for cluster_id in sorted({lease.cluster_id for lease in idle}):
            query = (
                select(Job.owner)
                .where(Job.cluster_id == cluster_id)
                .order_by(col(Job.created_at).desc())
                .limit(1)
            )
            cluster_owners[cluster_id] = session.exec(query).first()
        events: dict[str, list[str]] = {}
        if live_ids:
            query = (
                select(Event.job_id, Event.message)
                .where(Event.kind == event_kind, col(Event.job_id).in_(live_ids))
                .order_by(col(Event.id))
            )
            for job_id, message in session.exec(query):
                events.setdefault(job_id, []).append(message)
    return MonthRows(leases, idle, owners, cluster_owners, live, events)
