"""Pure decisions of the controller: must the run be stopped (and why)?

Every function here takes plain values (prices, times, streaks) and returns a decision; the
controller does the I/O. Money is exact (Decimal); times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from orchestrator.job_state import JobState


@dataclass(frozen=True)
class StopOrder:
    """Why a running job must be ended now, and the state and exit code it ends with."""

    state: JobState
    exit_code: int
    reason: str


def budget_order(
    *,
    spend: Decimal,
    hourly_rate: Decimal,
    max_cost: Decimal | None,
    max_hourly: Decimal | None,
    horizon_s: float,
) -> StopOrder | None:
    """Stop before the spend can cross `max_cost`, or when the rate exceeds `max_hourly`.

    `horizon_s` is how far ahead the spend must stay under the cap: the time until the next
    budget check plus the time a stop takes (SIGTERM, checkpoint pull, terminate). Stopping
    when `spend + rate x horizon >= cap` means the recorded spend ends at or below the cap as
    long as the stop takes no longer than allowed for; it can overshoot by at most one check's
    cost when a stop runs late.
    """
    if max_hourly is not None and hourly_rate > max_hourly:
        return StopOrder(
            JobState.BUDGET_STOPPED,
            4,
            f"the job's nodes cost ${hourly_rate}/h, above budget.max_hourly_usd ${max_hourly}/h",
        )
    if max_cost is None:
        return None
    projected = spend + hourly_rate * Decimal(str(horizon_s)) / Decimal(3600)
    if projected >= max_cost:
        return StopOrder(
            JobState.BUDGET_STOPPED,
            4,
            f"spend ${spend:.4f} would reach the cap budget.max_cost_usd ${max_cost} "
            f"within {horizon_s:.0f} s at ${hourly_rate}/h; stopped",
        )
    return None


def runtime_order(*, elapsed_s: float, max_runtime_s: float | None) -> StopOrder | None:
    """End the job once it has run for `budget.max_runtime` seconds."""
    if max_runtime_s is not None and elapsed_s >= max_runtime_s:
        return StopOrder(
            JobState.TIMED_OUT,
            1,
            f"ran for {elapsed_s:.0f} s, budget.max_runtime is {max_runtime_s:.0f} s",
        )
    return None


def idle_order(*, idle_for_s: float, idle_timeout_s: float | None, what: str) -> StopOrder | None:
    """End the job once its GPUs (or, without GPUs, its processes) idled for the timeout."""
    if idle_timeout_s is not None and idle_for_s >= idle_timeout_s:
        return StopOrder(
            JobState.IDLE_STOPPED,
            1,
            f"{what} idle for {idle_for_s:.0f} s (budget.idle_timeout {idle_timeout_s:.0f} s)",
        )
    return None


STALLED_EXIT = 5
"""The exit code of a job stopped as STALLED (`budget.stall_timeout`)."""


def stall_order(
    *, quiet_s: float, stall_timeout_s: float | None, step: int | None
) -> StopOrder | None:
    """End the job once rank 0 made no progress for `budget.stall_timeout` seconds: its step
    (`step`, None for a run that never printed one: its output) did not advance."""
    if stall_timeout_s is None or quiet_s < stall_timeout_s:
        return None
    what = "printed nothing" if step is None else f"stayed at step {step}"
    return StopOrder(
        JobState.STALLED,
        STALLED_EXIT,
        f"rank 0 {what} for {quiet_s:.0f} s (budget.stall_timeout {stall_timeout_s:.0f} s); "
        "stopped as stalled",
    )


def guard_limit_at(
    *,
    at: datetime,
    started_at: datetime | None,
    max_runtime_s: float | None,
    spend: Decimal,
    max_cost: Decimal | None,
    reserve_usd: Decimal,
    idle_timeout_s: float | None,
    stall_timeout_s: float | None = None,
) -> str:
    """The limit a node's guard acted on when its node powered off at `at`, inferred from the
    job's limits (for providers that cannot say why a node shut itself down).

    max_runtime when the run had reached it, budget when the spend was within `reserve_usd`
    (what a stop costs) of the cap, else idle when an idle timeout is set, else stall when a
    stall timeout is, else the dead-man switch (the run had ended and no controller was
    heard)."""
    if (
        max_runtime_s is not None
        and started_at is not None
        and (at - started_at).total_seconds() >= max_runtime_s
    ):
        return "max_runtime"
    if max_cost is not None and spend + reserve_usd >= max_cost:
        return "budget"
    if idle_timeout_s:
        return "idle"
    if stall_timeout_s:
        return "stall"
    return "deadman"
