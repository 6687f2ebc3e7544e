"""The monthly budgets (`budget.monthly_usd`, `budget.user_monthly_usd`) against the ledger:
the figures of each cap, the check a submit must pass, the stop of a running job and the
guards' lease. The arithmetic is `orchestrator.control.money.team_budget`'s; this reads the rows.

Every controller of every machine that shares the ledger reads the same rows, so the caps hold
across them: a job's spend counts toward the cap whoever submitted it, and each running job
projects the whole team's hourly rate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from orchestrator.config import BudgetSettings
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.money.team_budget import (
    RESERVED_EVENT,
    Figures,
    LiveJob,
    Refusal,
    Span,
    month_window,
    planned_cost,
    refusal,
    reservation_message,
    reserved_amount,
    runs_out_at,
    scopes,
    stop_order,
)
from orchestrator.errors import BudgetRefused
from orchestrator.ledger.month import MonthRows, month_rows
from orchestrator.ledger.store import Job, Ledger, hourly_rate, total_cost, utcnow
from orchestrator.providers.plan import LaunchPlan
from orchestrator.spec.model import Budget


@dataclass(frozen=True)
class SubmitBudget:
    """What a submit's plan means for the monthly caps (shown by `--dry-run`)."""

    planned_usd: Decimal | None  # the job's planned cost; None: it has no limit
    figures: tuple[Figures, ...]  # each cap that applies, before this job
    refused: Refusal | None  # the first cap it does not fit in, if any

    def as_dict(self) -> dict:
        return {
            "planned_usd": None if self.planned_usd is None else str(self.planned_usd),
            "caps": [figures.as_dict() for figures in self.figures],
            "refused": None if self.refused is None else self.refused.reason(),
        }

    def lines(self) -> list[str]:
        planned = "none" if self.planned_usd is None else f"${self.planned_usd:.2f}"
        lines = [f"planned cost {planned}; {figures.text()}" for figures in self.figures]
        if self.refused is not None:
            lines.append(f"a submit would be refused (exit 4): {self.refused.reason()}")
        return lines


def plan_cost(budget: Budget, plan: LaunchPlan) -> Decimal | None:
    """The planned cost of a job with `budget` launched as `plan` (`team_budget.planned_cost`)."""
    return planned_cost(
        max_cost_usd=budget.max_cost_usd,
        max_runtime_s=budget.max_runtime,
        hourly_usd=plan.hourly_usd,
    )


class TeamCaps:
    """The monthly caps of `settings` over the jobs of `ledger`; one read per question."""

    def __init__(self, settings: BudgetSettings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger

    def figures(self, owner: str | None, now: datetime | None = None) -> list[Figures]:
        """Where each cap that applies to a job of `owner` stands at `now`."""
        now = now or utcnow()
        caps = scopes(
            monthly_usd=self.settings.monthly_usd,
            user_monthly_usd=self.settings.user_monthly_usd,
            owner=owner,
        )
        if not caps:
            return []
        start, _ = month_window(now)
        rows = month_rows(self.ledger, start, event_kind=RESERVED_EVENT)
        spans = _spans(rows)
        live = [_live_job(job, rows, now) for job in rows.live]
        return [cap.figures(spans, live, now) for cap in caps]

    # --- submit -------------------------------------------------------------------------
    def check_submit(
        self, budget: Budget, plan: LaunchPlan, owner: str | None, now: datetime | None = None
    ) -> SubmitBudget:
        """The caps' view at `now` of a job about to be submitted (nothing is written)."""
        planned = plan_cost(budget, plan)
        figures = tuple(self.figures(owner, now))
        refused = next((found for found in (refusal(f, planned) for f in figures) if found), None)
        return SubmitBudget(planned, figures, refused)

    def admit(
        self, budget: Budget, plan: LaunchPlan, owner: str | None, now: datetime | None = None
    ) -> SubmitBudget:
        """`check_submit`, raising `BudgetRefused` (exit 4, nothing launched) when the job's
        planned cost does not fit in what a cap has left."""
        checked = self.check_submit(budget, plan, owner, now)
        if checked.refused is not None:
            raise BudgetRefused(checked.refused.message(), hint=checked.refused.hint())
        return checked

    def reserve(self, job_id: str, checked: SubmitBudget) -> None:
        """Record the planned cost of a registered job, which live jobs' reservations are read
        from (`team_budget.reserved_amount`)."""
        if checked.planned_usd is not None and checked.figures:
            message = reservation_message(checked.planned_usd, checked.figures)
            self.ledger.add_event(job_id, RESERVED_EVENT, message)

    # --- running jobs -------------------------------------------------------------------
    def stop_order(self, job: Job, *, horizon_s: float) -> StopOrder | None:
        """The stop of a running `job` when the spend of a cap it is under, projected at that
        cap's total hourly rate over `horizon_s`, would reach the cap."""
        for figures in self.figures(job.owner):
            order = stop_order(figures, horizon_s=horizon_s)
            if order is not None:
                return order
        return None

    def lease_until(self, job: Job, *, reserve_s: float, now: datetime) -> datetime | None:
        """The latest time the nodes of `job` may bill on the caps it is under: when the first
        would be passed at its current total rate, less `reserve_s`; None without caps."""
        ends = [runs_out_at(f, reserve_s=reserve_s) for f in self.figures(job.owner, now)]
        return min((end for end in ends if end is not None), default=None)

    def shared_budgets(self, job: Job) -> tuple[tuple[Decimal, Decimal], ...]:
        """For a launch's guard terms: per cap, what is left of it this month and the hourly
        rate its open leases bill (the launch's own nodes come on top)."""
        return tuple((f.cap_usd - f.spent_usd, f.hourly_usd) for f in self.figures(job.owner))


def _spans(rows: MonthRows) -> list[Span]:
    spans = [
        Span(rows.owners.get(lease.job_id), lease.price_per_hour, lease.launched_at, lease.ended_at)
        for lease in rows.leases
    ]
    spans += [
        Span(rows.cluster_owners.get(idle.cluster_id), idle.price_per_hour, idle.launched_at,
             idle.ended_at)
        for idle in rows.idle_leases
    ]  # fmt: skip
    return spans


def _live_job(job: Job, rows: MonthRows, now: datetime) -> LiveJob:
    """A live job's planned cost: the one recorded at its submit, else its own
    `max_cost_usd`, else its `max_runtime` at the rate its open leases bill (an older orch's
    job, or one submitted before the cap was set); its spend is all its leases'."""
    leases = [lease for lease in rows.leases if lease.job_id == job.id]
    recorded = [reserved_amount(text) for text in rows.events.get(job.id, [])]
    planned = next((amount for amount in reversed(recorded) if amount is not None), None)
    if planned is None:
        budget = json.loads(job.spec_json or "{}").get("budget") or {}
        max_cost = budget.get("max_cost_usd")
        planned = planned_cost(
            max_cost_usd=None if max_cost is None else Decimal(str(max_cost)),
            max_runtime_s=budget.get("max_runtime"),
            hourly_usd=hourly_rate(leases),
        )
        if planned == 0 and not leases:
            planned = None  # a max_runtime whose price is not known yet
    return LiveJob(job.id, job.owner, planned, total_cost(leases, now))
