"""The live side of the deadline-aware spot policies: decide, record, and say when to move.

A job whose spec names a `spot_policy` gets one `DeadlineDriver`. The controller asks it:

- `decide_idle(step)` when the job has no node (at the start, after a reclaim or a planned
  move, while waiting): spot, on-demand or wait;
- `tick(market, step)` every `policy_interval` while the job runs: None to stay, or a
  `PlannedMove` to another market (or to waiting) that the controller then carries out;
- `launch_spot` for the market of the next launch (and `launch_zones` for its zones), and
  `spot_refused()` when that launch was refused for capacity (the next decision then sees no
  spot, or with a zone-aware policy no spot in that zone); `ran_in(zone)` once nodes are up.

A zone-aware policy (`uniform-progress-mz`, ...: the simulator's `MultiZonePolicy`) decides a
zone too, from the provider's answer per zone (`ZoneMarketView`; see
`orchestrator.spot.zone_choice`): spot goes to the zone the job last ran in while it has spot,
else to the cheapest zone with spot, so a reclaim in a zone without spot left moves the whole
job to another zone with spot instead of to on-demand.

The driver measures the inputs (see `orchestrator.spot.inputs`): the work left from the
trainer's step rate and `total_steps`, the time left to the deadline, the restart overhead from
the job's own starts (until it has one: `restart_overhead_prior`), whether spot can be had (the
provider's `MarketView`; unknown counts as yes, and spot nodes the job still holds count as
spot had), and the prices. Every change of decision is an event (POLICY); the decision in force
and the policy's state (the zone chosen and the zone last run in included) are written to the
ledger (`Job.policy_state`) before the controller acts on them, so a new controller goes on
with the same line, commitments and zone.
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
from orchestrator.providers.base import (
    LaunchRequest,
    MarketPrices,
    MarketView,
    Provider,
    ZoneMarket,
    ZoneMarketView,
)
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
from orchestrator.spot.zone_choice import ZoneReading, launch_zones, read_zones
from orchestrator.spot.zones import ZONE_POLICY_NAMES, ZonePolicy, get_zone_policy

__all__ = ["POLICY_EVENT", "SWITCHED_EVENT", "DeadlineDriver", "PlannedMove", "price_request"]

POLICY_EVENT = "POLICY"
"""Event kind of a change of the policy's decision."""

SWITCHED_EVENT = "SWITCHED"
"""Event kind written once a planned move has ended the job's nodes."""

PRICES_TTL_S = 300.0  # how long the providers' prices are trusted before asking again
_RATE_CHANGE = 0.05  # a step rate that moved this much (relative) is written to the ledger


@dataclass(frozen=True)
class PlannedMove:
    """The policy wants the job off its current nodes: onto the other market or another zone,
    or waiting."""

    source: Decision  # what it runs on now: SPOT or ON_DEMAND
    to: Decision  # SPOT, ON_DEMAND or WAIT
    reason: str  # the inputs that led there, for the events
    zone: str | None = None  # zone-aware policies: the zone it moves to (None: no zone)

    def describe(self) -> str:
        where = f" in {self.zone}" if self.zone and self.to is not Decision.WAIT else ""
        return f"{self.source.value} -> {self.to.value}{where} ({self.reason})"


@dataclass(frozen=True)
class _Choice:
    decision: Decision
    zone: str | None  # zone-aware policies: where (None: no zone)
    why: str  # the inputs, for the events
    finishing: bool  # no work left: the run is ending, nothing moves


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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if spec.spot_policy is None:
            raise ValueError("the job has no spot_policy")
        self.job_id = job_id
        self.name = spec.spot_policy
        self.zone_policy: ZonePolicy | None = None
        if spec.spot_policy in ZONE_POLICY_NAMES:
            self.zone_policy = get_zone_policy(spec.spot_policy)
        self.policy = get_policy(spec.spot_policy.removesuffix("-mz"))  # single-zone rules
        self.nodes = spec.resources.nodes
        self.ledger = ledger
        self.provider = provider
        self.launch_request = launch_request
        self.interval_s = interval_s
        self.overhead_prior_s = overhead_prior_s
        self.submitted_at = submitted_at
        self.deadline = spec.deadline_at(submitted_at)
        self.clock = clock
        self.monotonic = monotonic  # seconds, for how long a refused spot launch is remembered
        self.state = state or DriverState()
        self._rate = StepRate(self.state.steps_per_s)
        self._lock = threading.Lock()
        self._prices: tuple[float, MarketPrices] | None = None
        self._refused_at: float | None = None
        self._refused_zones: set[str] = set()  # spot refused there, since `_refused_at`
        self._zone_markets: tuple[ZoneMarket, ...] | None = None  # the provider's last answer
        self._reading: ZoneReading | None = None  # the zones at the last decision
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

    @property
    def zone(self) -> str | None:
        """The zone of the decision in force (zone-aware policies; None: none chosen)."""
        return self.state.zone

    @property
    def launch_zones(self) -> tuple[str, ...] | None:
        """The zones the next launch may use, in the policy's order (spot: the chosen zone
        only); None: the spec's zones (a single-zone policy, or a provider without zones)."""
        if self.zone_policy is None or self.state.market is None:
            return None
        return launch_zones(self._reading, self.state.market, self.state.zone)

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

    def spot_refused(self, zone: str | None = None) -> None:
        """A spot launch was just refused for capacity: the next decision sees no spot. With
        a zone-aware policy only `zone` (None: the chosen one) lacks spot, until a decision
        interval passes with no other refusal: each zone is tried once before any again."""
        with self._lock:
            self._refused_at = self.monotonic()
            zone = zone or self.state.zone
            if zone is not None:
                self._refused_zones.add(zone)

    def ran_in(self, zone: str | None) -> None:
        """The job's nodes are up in `zone`: its checkpoint is there from now on. Written to
        the ledger when it changes (a zone-aware policy weighs a move away from it)."""
        with self._lock:
            if self.zone_policy is None or zone is None or zone == self.state.ran_in:
                return
            self.state = replace(self.state, ran_in=zone)
            self._save(force=True)

    def decide_idle(self, step: int | None) -> Decision:
        """What to launch on (or to wait) while the job has no node; `step` is what a start
        would resume from. Records and keeps the decision (and its zone: `zone`)."""
        return self._decide(Running.NOTHING, step, None).decision

    def tick(
        self, market: str | None, step: int | None, zone: str | None = None
    ) -> PlannedMove | None:
        """One decision while the job runs on `market` (in `zone`); a move when the policy
        wants another market or zone (or to wait). Nothing while the run is finishing (no
        work left)."""
        running = running_on(market)
        if running is Running.NOTHING:
            return None
        if zone is not None:
            self.ran_in(zone)
        choice = self._decide(running, step, zone)
        here = Decision.SPOT if running is Running.SPOT else Decision.ON_DEMAND
        elsewhere = zone is not None and choice.zone is not None and choice.zone != zone
        if choice.finishing or (choice.decision is here and not elsewhere):
            return None
        return PlannedMove(here, choice.decision, choice.why, choice.zone)

    def commit(self, decision: Decision, zone: str | None = None) -> None:
        """The controller carries out `decision` (in `zone`; None: the zone decided last) now:
        write it first (intent before action)."""
        with self._lock:
            self.state = replace(self.state, market=decision, zone=zone or self.state.zone)
            self._save(force=True)

    # --- deciding -----------------------------------------------------------------------------

    def _decide(self, running: Running, step: int | None, zone: str | None) -> _Choice:
        with self._lock:
            if self.zone_policy is None:
                choice = self._decide_market(running, step)
            else:
                choice = self._decide_zone(self.zone_policy, running, step, zone)
            state = self.state
            runs = choice.decision is not Decision.WAIT  # waiting is in no zone
            zone_moved = runs and choice.zone != state.zone
            changed = not choice.finishing and (choice.decision is not state.market or zone_moved)
            if changed:
                where = f" in {choice.zone}" if choice.zone and runs else ""
                self.ledger.add_event(
                    self.job_id, POLICY_EVENT,
                    f"{self.name}: {choice.decision.value}{where} ({choice.why})", step=step,
                )  # fmt: skip
                zone = choice.zone if runs else state.zone
                self.state = replace(self.state, market=choice.decision, zone=zone)
            self._save(force=changed or self.state.policy != self._saved.policy)
            return choice

    def _decide_market(self, running: Running, step: int | None) -> _Choice:
        spot_up = self._spot_available(running)
        spot_price, on_demand_price = self._market_prices()
        work = self._work(step)
        if work is None:
            decision = fallback_decision(
                self.policy.name, spot_available=spot_up,
                spot_pays=spot_price < on_demand_price, running=running,
            )  # fmt: skip
            return _Choice(decision, None, self._why(None), finishing=False)
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
        return _Choice(decision, None, self._why(inputs), finishing=inputs.work_left_s <= 0)

    def _decide_zone(
        self, policy: ZonePolicy, running: Running, step: int | None, zone: str | None
    ) -> _Choice:
        """The zone-aware policy's decision, on the provider's answer per zone."""
        self._reading = reading = self._read_zones(running, zone)
        work = self._work(step)
        inputs = reading.inputs(
            work=work,
            time_left_s=self._time_left_s(),
            total_time_s=self._total_time_s(),
            overhead_s=self._restart_overhead_s(),
            running=running,
            checkpoint=self.state.ran_in,
            decision_interval_s=self.interval_s,
            spent_usd=self._spent_per_node(),
        )
        if work is None:
            spot_zone = inputs.spot_zone()
            decision = fallback_decision(
                self.policy.name, spot_available=spot_zone is not None, spot_pays=True,
                running=running,
            )  # fmt: skip
            if running is not Running.NOTHING:
                where = zone or self.state.ran_in  # a running node is kept where it is
            elif decision is Decision.SPOT and spot_zone is not None:
                where = reading.zones[spot_zone]
            else:
                where = reading.zones[inputs.home()]
            why = f"{self._why(None)}; {self._zones_why(reading, running)}"
            return _Choice(decision, where, why, finishing=False)
        decision, index, policy_state = policy.decide(inputs, self.state.policy)
        self.state = replace(self.state, policy=policy_state)
        why = f"{_work_why(inputs.view(None))}, {self._zones_why(reading, running)}"
        return _Choice(decision, reading.zones[index], why, finishing=inputs.work_left_s <= 0)

    def _zones_why(self, reading: ZoneReading, running: Running) -> str:
        why = f"{reading.describe()}, on {running}"
        if self.state.ran_in is not None:
            why += f", checkpoint in {self.state.ran_in}"
        return why

    def _read_zones(self, running: Running, zone: str | None) -> ZoneReading:
        """Ask the provider about every zone (a provider without zones is one); a zone whose
        spot was refused within the last decision interval has none."""
        if self._refused_at is not None and self.monotonic() - self._refused_at >= max(
            self.interval_s, 1.0
        ):
            self._refused_at = None
            self._refused_zones.clear()
        holding = (zone or self.state.ran_in) if running is Running.SPOT else None
        if not isinstance(self.provider, ZoneMarketView):
            spot_price, on_demand_price = self._market_prices()
            return ZoneReading.single(
                spot=self._spot_available(running), spot_price=spot_price,
                on_demand_price=on_demand_price,
            )  # fmt: skip
        try:
            self._zone_markets = self.provider.zone_markets(self.launch_request)
        except OrchError as exc:
            self.ledger.add_event(self.job_id, "WARNING", f"no zone markets: {exc}")
        return read_zones(
            self._zone_markets or (), refused=self._refused_zones, holding=holding,
            default_prices=(DEFAULT_PRICE_RATIO, Decimal(1)),
        )  # fmt: skip

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
            if self.monotonic() - self._refused_at < max(self.interval_s, 1.0):
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
        return (
            f"{_work_why(inputs)}, spot "
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


def _work_why(inputs: PolicyInputs) -> str:
    """The work, time and restart behind a decision, for the events."""
    time_left = (
        "no deadline" if inputs.time_left_s == float("inf")
        else f"time left {inputs.time_left_s:.0f} s"
    )  # fmt: skip
    return (
        f"work left {inputs.work_left_s:.0f} s, {time_left}, restart "
        f"{inputs.restart_overhead_s:.0f} s"
    )
