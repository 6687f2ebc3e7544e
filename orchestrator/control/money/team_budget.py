"""Pure: the monthly budget of everyone who shares the ledger (`budget.monthly_usd`) and of each
owner label in it (`budget.user_monthly_usd`).

A cap covers one UTC calendar month, from 00:00 on its first day to 00:00 on the next month's.
What counts against it (`Scope`):

- spent this month: every billable span (a job's node lease, a kept cluster's idle lease) at
  its recorded price, clipped to the month: seconds inside the month x price / 3600, the
  ledger's own measure (`orchestrator.ledger.measures.lease_cost`) on the clipped span;
- reserved: what each live (not final) job may still spend, its planned cost minus what it
  has spent so far (never below zero). A live job without a planned cost (submitted before
  the cap was set) reserves nothing; its nodes still count in the hourly rate below.

What is left = cap - spent this month - reserved. A submit whose planned cost does not fit in
what is left is refused (`refusal`); a running job is stopped once the spend of its scope,
projected at the scope's total hourly rate (every open lease in it, other people's jobs
included), would reach the cap before the next check and the stop are done (`stop_order`); the
nodes' guards get a lease that never reaches past the moment the scope's spend would pass the
cap at that rate (`runs_out_at`).

A job's planned cost (`planned_cost`) is its `budget.max_cost_usd`, else the launch plan's
price for the whole cluster x `budget.max_runtime`; a job with neither has none, and under a
cap it is refused (it could spend all that is left, and then some).

Money is USD as Decimal, times are aware UTC datetimes, durations seconds. Nothing here reads
the ledger or a clock: the caller passes rows and `now`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.job_state import JobState

HOUR = Decimal(3600)
CENT = Decimal("0.01")


def month_window(now: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month holding `now` (aware): its first instant, and the next month's."""
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


@dataclass(frozen=True)
class Span:
    """One node's billable time: a job's lease or a kept cluster's idle lease."""

    owner: str | None  # the owner label it is billed to (`Job.owner`); None: unknown
    price_per_hour: Decimal  # USD, recorded at launch
    launched_at: datetime
    ended_at: datetime | None  # None: still billing


def span_cost(span: Span, start: datetime, now: datetime) -> Decimal:
    """What `span` cost between `start` and `now` (clipped to both; nothing after `now`)."""
    begin = max(span.launched_at, start)
    end = min(span.ended_at or now, now)
    seconds = max(Decimal(0), Decimal(str((end - begin).total_seconds())))
    return seconds * span.price_per_hour / HOUR


@dataclass(frozen=True)
class LiveJob:
    """A job that is not final, as far as the budget is concerned."""

    job_id: str
    owner: str | None
    planned_usd: Decimal | None  # its planned cost; None: none known (reserves nothing)
    spent_usd: Decimal  # everything its leases cost so far, this month or before


def planned_cost(
    *, max_cost_usd: Decimal | None, max_runtime_s: float | None, hourly_usd: Decimal
) -> Decimal | None:
    """The most a job is planned to cost: `max_cost_usd`, else `hourly_usd` (the whole
    cluster's price per hour in the launch plan) x `max_runtime_s`; None with neither."""
    if max_cost_usd is not None:
        return max_cost_usd
    if max_runtime_s is not None:
        return hourly_usd * Decimal(str(max_runtime_s)) / HOUR
    return None


@dataclass(frozen=True)
class Figures:
    """Where one cap stands at `at`."""

    label: str  # "team" or "user NAME"
    setting: str  # the setting that holds the cap, e.g. "budget.monthly_usd"
    cap_usd: Decimal
    spent_usd: Decimal  # spent this month, clipped to it
    reserved_usd: Decimal  # what live jobs may still spend
    hourly_usd: Decimal  # the scope's open spans together, per hour
    at: datetime

    @property
    def left_usd(self) -> Decimal:
        """What a new job may still plan to spend: cap - spent - reserved (may be negative)."""
        return self.cap_usd - self.spent_usd - self.reserved_usd

    @property
    def name(self) -> str:
        return f"the {self.label} budget {self.setting} ${self.cap_usd}"

    def as_dict(self) -> dict[str, str]:
        """The figures for a JSON document (money as exact decimal text)."""
        return {
            "scope": self.label,
            "setting": self.setting,
            "cap_usd": str(self.cap_usd),
            "spent_usd": str(_cents(self.spent_usd)),
            "reserved_usd": str(_cents(self.reserved_usd)),
            "left_usd": str(_cents(self.left_usd)),
            "hourly_usd": str(self.hourly_usd),
            "month": f"{self.at:%Y-%m}",
        }

    def text(self) -> str:
        return (
            f"{self.name} for {self.at:%Y-%m}: spent ${_cents(self.spent_usd)} this month, "
            f"${_cents(self.reserved_usd)} reserved by live jobs, "
            f"${_cents(self.left_usd)} left"
        )


def _cents(value: Decimal) -> Decimal:
    """Money shown to a person: to the cent, rounded toward zero (never shows more left)."""
    return value.quantize(CENT, rounding="ROUND_DOWN")


@dataclass(frozen=True)
class Scope:
    """One cap and whose spending it covers: everyone's (`owner` None) or one owner label's."""

    label: str
    setting: str
    cap_usd: Decimal
    owner: str | None = None  # None: every span and job; else only this owner's

    def covers(self, owner: str | None) -> bool:
        return self.owner is None or owner == self.owner

    def figures(self, spans: Iterable[Span], live: Iterable[LiveJob], now: datetime) -> Figures:
        """Where this cap stands at `now`, from every span that may bill in the month and
        every live job (other scopes' rows are left out here)."""
        start, _ = month_window(now)
        mine = [span for span in spans if self.covers(span.owner)]
        spent = sum((span_cost(span, start, now) for span in mine), Decimal(0))
        hourly = sum((span.price_per_hour for span in mine if span.ended_at is None), Decimal(0))
        reserved = sum(
            (
                max(Decimal(0), job.planned_usd - job.spent_usd)
                for job in live
                if self.covers(job.owner) and job.planned_usd is not None
            ),
            Decimal(0),
        )
        return Figures(self.label, self.setting, self.cap_usd, spent, reserved, hourly, now)


def scopes(
    *, monthly_usd: Decimal | None, user_monthly_usd: Decimal | None, owner: str | None
) -> list[Scope]:
    """The caps that apply to a job of `owner`: the team's, then the owner's own. A job with
    no owner label (an older orch's) is under the team cap only."""
    found = []
    if monthly_usd is not None:
        found.append(Scope("team", "budget.monthly_usd", monthly_usd))
    if user_monthly_usd is not None and owner is not None:
        found.append(Scope(f"user {owner}", "budget.user_monthly_usd", user_monthly_usd, owner))
    return found


# --- submit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """Why a submit is refused under a monthly cap, with the figures that say so."""

    figures: Figures
    planned_usd: Decimal | None  # None: the job has no planned cost

    def reason(self) -> str:
        if self.planned_usd is None:
            return (
                f"under {self.figures.name} a job needs a spend limit, and this one has neither "
                f"budget.max_cost_usd nor budget.max_runtime ({self.figures.text()})"
            )
        return (
            f"the job's planned cost ${_cents_up(self.planned_usd)} does not fit in "
            f"{self.figures.text()}"
        )

    def message(self) -> str:
        return f"not launched: {self.reason()}"

    def hint(self) -> str:
        left = max(Decimal(0), _cents(self.figures.left_usd))
        if self.planned_usd is None:
            return (
                f"give the job a limit that fits in ${left}: --max-cost USD or "
                "budget.max_runtime (or controller.default_max_runtime for every job)"
            )
        return (
            f"lower the job's cost to at most ${left} (--max-cost, budget.max_runtime, fewer or "
            f"cheaper nodes), wait for live jobs to end (`orch status`), or ask whoever keeps "
            f"the config to raise {self.figures.setting}"
        )


def _cents_up(value: Decimal) -> Decimal:
    return value.quantize(CENT, rounding="ROUND_UP")


def refusal(figures: Figures, planned_usd: Decimal | None) -> Refusal | None:
    """The refusal of a job planned to cost `planned_usd` under `figures`, or None when it
    fits: spent + reserved + planned stays at or under the cap. A job with no planned cost
    never fits (nothing bounds what it could spend)."""
    if planned_usd is None or planned_usd > figures.left_usd:
        return Refusal(figures, planned_usd)
    return None


# --- running jobs ---------------------------------------------------------------------------


def stop_order(figures: Figures, *, horizon_s: float) -> StopOrder | None:
    """Stop a running job before its scope's spend this month can cross the cap.

    The projection uses the scope's total hourly rate (every open span in it, other jobs
    included): no job knows when the others will stop, so each stops itself early enough on
    its own. `horizon_s` is the time until the next budget check plus what the stop takes.
    """
    projected = figures.spent_usd + figures.hourly_usd * Decimal(str(horizon_s)) / HOUR
    if projected < figures.cap_usd:
        return None
    return StopOrder(
        JobState.BUDGET_STOPPED,
        4,
        f"{figures.name} for {figures.at:%Y-%m}: spent ${figures.spent_usd:.4f} this month "
        f"would reach the cap within {horizon_s:.0f} s at ${figures.hourly_usd}/h (every live "
        "job of the scope together); stopped",
    )


def runs_out_at(
    figures: Figures, *, reserve_s: float, extra_hourly_usd: Decimal = Decimal(0)
) -> datetime | None:
    """When the scope's spend would pass the cap at its current total rate (plus
    `extra_hourly_usd`: nodes about to launch), less `reserve_s` for the stop itself; never
    before `figures.at`. None when nothing in the scope bills."""
    hourly = figures.hourly_usd + extra_hourly_usd
    if hourly <= 0:
        return None
    seconds = float((figures.cap_usd - figures.spent_usd) / hourly * HOUR) - reserve_s
    return figures.at + timedelta(seconds=max(0.0, int(seconds * 1000) / 1000))


# --- the planned cost a submit records ------------------------------------------------------

RESERVED_EVENT = "RESERVED"  # the event kind that records a job's planned cost at submit
_RESERVED = re.compile(r"planned cost \$(\d+(?:\.\d+)?)")


def reservation_message(planned_usd: Decimal, figures: Iterable[Figures]) -> str:
    """The text of the event that records a job's planned cost (read back by
    `reserved_amount`), with the caps it was counted against."""
    against = "; ".join(f.name for f in figures)
    return f"planned cost ${planned_usd:f} reserved against {against}"


def reserved_amount(message: str) -> Decimal | None:
    """The planned cost a `reservation_message` recorded; None for any other text."""
    match = _RESERVED.search(message)
    return Decimal(match.group(1)) if match else None
