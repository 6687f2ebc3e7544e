"""The live side of the deadline-aware spot policies: decide, record, and say when to move.

A job whose spec names a `spot_policy` gets one `DeadlineDriver`. The controller asks it:

- `decide_idle(step)` when the job has no node (at the start, after a reclaim or a planned
  move, while waiting): spot, on-demand or wait;
- `tick(market, step)` every `policy_interval` while the job runs: None to stay, or a
  `PlannedMove` to another market (or to waiting) that the controller then carries out;
- `launch_spot` for the market of the next launch, and `spot_refused()` when that launch was
  refused for capacity (the next decision then sees no spot).

The driver measures the inputs (see `orchestrator.spot.inputs`): the work left from the
trainer's step rate and `total_steps`, the time left to the deadline, the restart overhead from
the job's own starts (until it has one: `restart_overhead_prior`), whether spot can be had (the
provider's `MarketView`; unknown counts as yes, and spot nodes the job still holds count as
spot had), and the prices. Every change of decision is an event (POLICY); the decision in force
and the policy's state are written to the ledger (`Job.policy_state`) before the controller
acts on them, so a new controller goes on with the same line and commitments.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal

from orchestrator.errors import OrchError
from orchestrator.ledger.store import Ledger, utcnow
from orchestrator.node.progress import Metrics
from orchestrator.providers.base import LaunchRequest, MarketPrices, MarketView, Provider
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec
from orchestrator.spot.inputs import (
    DriverState,
    StepRate,
    Work,
    fallback_decision,
    restart_durations,
    running_on,
)
from orchestrator.spot.policies import Decision, PolicyInputs, Running, get_policy
from orchestrator.spot.restart_overhead import estimate_restart_overhead
from orchestrator.spot.simulate import DEFAULT_PRICE_RATIO

__all__ = ["POLICY_EVENT", "SWITCHED_EVENT", "DeadlineDriver", "PlannedMove", "price_request"]

POLICY_EVENT = "POLICY"
"""Event kind of a change of the policy's decision."""

SWITCHED_EVENT = "SWITCHED"
"""Event kind written once a planned move has ended the job's nodes."""

PRICES_TTL_S = 300.0  # how long the providers' prices are trusted before asking again
_RATE_CHANGE = 0.05  # a step rate that moved this much (relative) is written to the ledger


@dataclass(frozen=True)
class PlannedMove:
    """The policy wants the job off its current nodes: onto the other market, or waiting."""

    source: Decision  # what it runs on now: SPOT or ON_DEMAND
    to: Decision  # SPOT, ON_DEMAND or WAIT
    reason: str  # the inputs that led there, for the events

    def describe(self) -> str:
        return f"{self.source.value} -> {self.to.value} ({self.reason})"


def price_request(job_id: str, spec: JobSpec) -> LaunchRequest:
    """The launch a job's nodes would need, on either market: what prices are asked for."""
    return launch_request(spec, job_id, spot="auto")


class DeadlineDriver:
    """Applies one job's spot policy; see the module docstring. Thread-safe: progress lines
    arrive in one thread while decisions are taken in another."""

    def __init__(
        self,
        *,
        job_id: str,
        spec: JobSpec,
        submitted_at: datetime,
        ledger: Ledger,
        provider: Provider,
        launch_request: LaunchRequest,
        interval_s: float,
        overhead_prior_s: float,
        state: DriverState | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if spec.spot_policy is None:
            raise ValueError("the job has no spot_policy")
        self.job_id = job_id
        self.policy = get_policy(spec.spot_policy)
        self.nodes = spec.resources.nodes
        self.ledger = ledger
        self.provider = provider
        self.launch_request = launch_request
        self.interval_s = interval_s
        self.overhead_prior_s = overhead_prior_s
        self.submitted_at = submitted_at
        self.deadline = spec.deadline_at(submitted_at)
        self.clock = clock
        self.state = state or DriverState()
        self._rate = StepRate(self.state.steps_per_s)
        self._lock = threading.Lock()
        self._prices: tuple[float, MarketPrices] | None = None
        self._refused_at: float | None = None
        self._saved = self.state

    # --- what the controller asks -----------------------------------------------------------

    @property
    def market(self) -> Decision | None:
        """The decision in force (None before the first one)."""
        return self.state.market

    @property
    def launch_spot(self) -> bool:
        """Whether the next launch is on spot (else on-demand)."""
        return self.state.market is Decision.SPOT

    def observe(self, metrics: Metrics, at_s: float | None = None) -> None:
        """A progress line of rank 0, read at `at_s` on the monotonic clock (default now); the
        lines of one read share its time (see `StepRate`)."""
        with self._lock:
            self._rate.add(time.monotonic() if at_s is None else at_s, metrics.step)
            if metrics.total_steps is not None:
                self.state = replace(self.state, total_steps=metrics.total_steps)
            if self._rate.rate is not None:
                self.state = replace(self.state, steps_per_s=self._rate.rate)

    def new_run(self) -> None:
        """A run (re)started: its step rate is measured afresh."""
        with self._lock:
            self._rate.new_run()

    def spot_refused(self) -> None:
        """A spot launch was just refused for capacity: the next decision sees no spot."""
        self._refused_at = time.monotonic()

    def decide_idle(self, step: int | None) -> Decision:
        """What to launch on (or to wait) while the job has no node; `step` is what a start
        would resume from. Records and keeps the decision."""
        decision, _ = self._decide(Running.NOTHING, step)
        return decision

    def tick(self, market: str | None, step: int | None) -> PlannedMove | None:
        """One decision while the job runs on `market`; a move when the policy wants another
        market (or to wait). Nothing while the run is finishing (no work left)."""
        running = running_on(market)
        if running is Running.NOTHING:
            return None
        decision, inputs = self._decide(running, step)
        here = Decision.SPOT if running is Running.SPOT else Decision.ON_DEMAND
        if decision is here or (inputs is not None and inputs.work_left_s <= 0):
            return None
        return PlannedMove(here, decision, self._why(inputs))

    def commit(self, decision: Decision) -> None:
        """The controller carries out `decision` now: write it first (intent before action)."""
        with self._lock:
            self.state = replace(self.state, market=decision)
            self._save(force=True)

    # --- deciding -----------------------------------------------------------------------------

    def _decide(self, running: Running, step: int | None) -> tuple[Decision, PolicyInputs | None]:
        with self._lock:
            spot_up = self._spot_available(running)
            spot_price, on_demand_price = self._market_prices()
            work = self._work(step)
            inputs: PolicyInputs | None = None
            if work is None:
                decision = fallback_decision(
                    self.policy.name, spot_available=spot_up,
                    spot_pays=spot_price < on_demand_price, running=running,
                )  # fmt: skip
                why = "work left unknown until the trainer reports its step rate and total_steps"
            else:
                inputs = work.inputs(
                    time_left_s=self._time_left_s(),
                    total_time_s=self._total_time_s(),
                    restart_overhead_s=self._restart_overhead_s(),
                    spot_available=spot_up,
                    running=running,
                    spot_price=spot_price,
                    on_demand_price=on_demand_price,
                    decision_interval_s=self.interval_s,
                    spent_usd=self._spent_per_node(),
                )
                decision, policy_state = self.policy.decide(inputs, self.state.policy)
                self.state = replace(self.state, policy=policy_state)
                why = self._why(inputs)
            finishing = inputs is not None and inputs.work_left_s <= 0
            changed = decision is not self.state.market and not finishing
            if changed:
                self.ledger.add_event(
                    self.job_id, POLICY_EVENT, f"{self.policy.name}: {decision.value} ({why})",
                    step=step,
                )  # fmt: skip
                self.state = replace(self.state, market=decision)
            self._save(force=changed or self.state.policy != self._saved.policy)
            return decision, inputs

    def _spent_per_node(self) -> Decimal:
        """What the job has been billed so far, per node (the policies' prices are per node):
        the savings rule of the deadline policies weighs it against the progress made."""
        return self.ledger.spend(self.job_id, now=self.clock()) / max(1, self.launch_request.count)

    def _work(self, step: int | None) -> Work | None:
        rate, total = self.state.steps_per_s, self.state.total_steps
        if rate is None or total is None or rate <= 0:
            return None
        return Work(step=step or 0, total_steps=total, steps_per_s=rate)

    def _time_left_s(self) -> float:
        if self.deadline is None:
            return float("inf")
        return (self.deadline - self.clock()).total_seconds()

    def _total_time_s(self) -> float:
        if self.deadline is None:
            return float("inf")
        return (self.deadline - self.submitted_at).total_seconds()

    def _restart_overhead_s(self) -> float:
        events = [(event.kind, event.at) for event in self.ledger.events(self.job_id)]
        return estimate_restart_overhead(restart_durations(events), prior_s=self.overhead_prior_s)

    def _spot_available(self, running: Running) -> bool:
        if running is Running.SPOT:
            return True  # the job holds spot nodes right now
        if self._refused_at is not None:
            if time.monotonic() - self._refused_at < max(self.interval_s, 1.0):
                return False
            self._refused_at = None
        if not isinstance(self.provider, MarketView):
            return True
        try:
            answer = self.provider.spot_available(self.nodes)
        except OrchError:
            answer = None
        return True if answer is None else answer

    def _market_prices(self) -> tuple[Decimal, Decimal]:
        """(spot, on-demand) per node-hour; unknown prices count spot as the usual third."""
        now = time.monotonic()
        if self._prices is None or now - self._prices[0] > PRICES_TTL_S:
            prices = MarketPrices(spot=None, on_demand=None)
            if isinstance(self.provider, MarketView):
                try:
                    prices = self.provider.market_prices(self.launch_request)
                except OrchError as exc:
                    self.ledger.add_event(self.job_id, "WARNING", f"no market prices: {exc}")
                    if self._prices is not None:
                        prices = self._prices[1]
            self._prices = (now, prices)
        prices = self._prices[1]
        if prices.on_demand is None and prices.spot is None:
            return DEFAULT_PRICE_RATIO, Decimal(1)
        if prices.on_demand is None:
            assert prices.spot is not None
            return prices.spot, prices.spot / DEFAULT_PRICE_RATIO
        if prices.spot is None:
            return prices.on_demand, prices.on_demand  # no spot offer: spot does not pay
        return prices.spot, prices.on_demand

    def _why(self, inputs: PolicyInputs | None) -> str:
        if inputs is None:
            return "work left unknown until the trainer reports its step rate and total_steps"
        time_left = (
            "no deadline" if inputs.time_left_s == float("inf")
            else f"time left {inputs.time_left_s:.0f} s"
        )  # fmt: skip
        return (
            f"work left {inputs.work_left_s:.0f} s, {time_left}, restart "
            f"{inputs.restart_overhead_s:.0f} s, spot "
            f"{'available' if inputs.spot_available else 'unavailable'}, on {inputs.running}"
        )

    def _save(self, *, force: bool) -> None:
        saved, now = self._saved, self.state
        rate_moved = (now.steps_per_s is None) != (saved.steps_per_s is None) or (
            now.steps_per_s is not None
            and saved.steps_per_s is not None
            and abs(now.steps_per_s - saved.steps_per_s) > _RATE_CHANGE * saved.steps_per_s
        )
        if force or rate_moved or now.total_steps != saved.total_steps:
            self.ledger.update_job(self.job_id, policy_state=now.to_json())
            self._saved = now
