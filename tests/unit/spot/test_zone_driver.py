"""The deadline driver under a zone-aware policy (`uniform-progress-mz`), on a real ledger
(SQLite): the zone it chooses from the provider's answer per zone, the zones it hands the
launch, what a refused zone changes, and the choice a new controller goes on with.

The provider here is plain data: what each zone offers, as `ZoneMarketView` answers it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.config import LocalSettings, Settings
from orchestrator.ledger.store import Job, Ledger
from orchestrator.node.progress import Metrics
from orchestrator.providers.base import LaunchRequest, ZoneMarket
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.spec.model import JobSpec
from orchestrator.spot.driver import DeadlineDriver, PlannedMove, price_request
from orchestrator.spot.inputs import DriverState
from orchestrator.spot.policies import Decision, Running
from orchestrator.spot.zone_choice import ZoneReading, launch_zones, read_zones

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
TOTAL = 400  # steps; at 4 steps/s: 100 s of work
OD = Decimal("3.06")
A, B, C = "us-east-1a", "us-east-1b", "us-east-1c"


@dataclass
class Zones:
    """What each zone offers the job's nodes: a provider's `zone_markets` answer as data."""

    markets: tuple[ZoneMarket, ...]

    name = "zones"

    def zone_markets(self, request: LaunchRequest) -> tuple[ZoneMarket, ...]:
        return self.markets

    def set_spot(self, zone: str, available: bool | None) -> None:
        self.markets = tuple(
            replace(m, spot_available=available) if m.zone == zone else m for m in self.markets
        )


def three_zones() -> Zones:
    """Spot of unknown availability (as EC2 says) in three zones, the first the cheapest."""
    return Zones(
        tuple(
            ZoneMarket(zone, None, Decimal(price), OD)
            for zone, price in ((A, "0.92"), (B, "1.01"), (C, "1.10"))
        )
    )


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return (self.now - T0).total_seconds()


def spec(policy: str = "uniform-progress-mz") -> JobSpec:
    return JobSpec.model_validate(
        {"name": "dl", "workdir": ".", "run": "true", "deadline": "300s", "spot_policy": policy}
    )


def driver(  # noqa: ANN201
    ledger: Ledger,
    zones: Zones | LocalProvider,
    clock: Clock,
    policy: str = "uniform-progress-mz",
):
    job_spec = spec(policy)
    try:
        job = ledger.get_job("dl-1")
    except Exception:
        job = ledger.add_job(
            Job(
                id="dl-1", name="dl", provider="aws", nodes=1, gpus_per_node=1,
                spec_json=job_spec.model_dump_json(), spec_path="job.yaml", created_at=T0,
            )
        )  # fmt: skip
    return DeadlineDriver(
        job_id="dl-1",
        spec=job_spec,
        submitted_at=T0,
        ledger=ledger,
        provider=zones,  # type: ignore[arg-type]  # only its market view is asked
        launch_request=price_request("dl-1", job_spec),
        interval_s=1.0,
        overhead_prior_s=10.0,
        state=DriverState.from_json(job.policy_state),
        clock=clock,
        monotonic=clock.monotonic,
    )


def measure(d: DeadlineDriver, step: int) -> None:
    """Progress lines at 4 steps/s, from `step` on."""
    d.new_run()
    for i in range(4):
        d.observe(Metrics(step + 4 * i, total_steps=TOTAL), at_s=float(i))


def policy_events(ledger: Ledger) -> list[str]:
    return [e.message for e in ledger.events("dl-1") if e.kind == "POLICY"]


def stored(ledger: Ledger) -> DriverState:
    return DriverState.from_json(ledger.get_job("dl-1").policy_state)


def test_the_first_launch_goes_to_the_cheapest_zone_with_spot(ledger: Ledger) -> None:
    zones = three_zones()
    d = driver(ledger, zones, Clock())
    assert d.decide_idle(None) is Decision.SPOT
    assert (d.zone, d.launch_zones) == (A, (A,))
    (event,) = policy_events(ledger)
    assert event.startswith(f"uniform-progress-mz: spot in {A} (work left unknown")
    assert f"spot in {A} ($0.9200/h), {B} ($1.0100/h), {C} ($1.1000/h)" in event
    assert (stored(ledger).market, stored(ledger).zone) == (Decision.SPOT, A)


def test_a_refused_zone_sends_spot_to_the_next_zone_not_to_on_demand(ledger: Ledger) -> None:
    """Tight deadline, the checkpoint in the first zone, whose spot launch was just refused:
    a single-zone policy sees no spot and waits; the zone-aware one takes the next zone's."""
    clock = Clock()
    zones = three_zones()
    d = driver(ledger, zones, clock)
    measure(d, 0)
    assert d.decide_idle(0) is Decision.SPOT and d.zone == A
    d.ran_in(A)
    clock.now = T0 + timedelta(seconds=170)  # 100 s of work, 130 s left: tight
    d.spot_refused()  # the launch in A (the zone in force)
    assert d.decide_idle(0) is Decision.SPOT
    assert (d.zone, d.launch_zones) == (B, (B,))
    assert policy_events(ledger)[-1].startswith(
        f"uniform-progress-mz: spot in {B} (work left 100 s, time left 130 s, restart 10 s, "
        f"spot in {B} ($1.0100/h), {C} ($1.1000/h), none in {A}, on nothing, checkpoint in {A})"
    )
    d.spot_refused(B)
    assert d.decide_idle(0) is Decision.SPOT and d.zone == C
    clock.now += timedelta(seconds=1)  # a decision interval without a refusal: A is tried again
    assert d.decide_idle(4) is Decision.SPOT and d.zone == A

    ledger.update_job("dl-1", policy_state=None)
    single = driver(ledger, zones, clock, policy="uniform-progress")
    measure(single, 0)
    single.spot_refused()
    assert single.decide_idle(0) is Decision.WAIT
    assert single.launch_zones is None  # the spec's zones: the provider ranks them


def test_the_zone_of_the_checkpoint_is_kept_while_it_has_spot_also_by_a_new_controller(
    ledger: Ledger,
) -> None:
    """The job ran in B (A had refused): A's spot is cheaper again, but a move there costs a
    restart, so spot stays in B; a controller built from the ledger chooses the same."""
    clock = Clock()
    zones = three_zones()
    d = driver(ledger, zones, clock)
    measure(d, 0)
    d.decide_idle(0)
    d.spot_refused(A)
    assert d.decide_idle(0) is Decision.SPOT and d.zone == B
    d.commit(Decision.SPOT)
    d.ran_in(B)
    assert (stored(ledger).zone, stored(ledger).ran_in) == (B, B)

    again = driver(ledger, zones, clock)  # a new controller: no refusal remembered
    measure(again, 40)
    clock.now = T0 + timedelta(seconds=20)
    assert again.decide_idle(40) is Decision.SPOT and again.zone == B
    assert again.launch_zones == (B,)
    zones.set_spot(B, False)  # B has no spot now: the cheapest zone with spot
    assert again.decide_idle(40) is Decision.SPOT and again.zone == A


def test_without_spot_in_any_zone_on_demand_runs_where_the_checkpoint_is(
    ledger: Ledger,
) -> None:
    clock = Clock()
    zones = three_zones()
    d = driver(ledger, zones, clock)
    measure(d, 0)
    d.decide_idle(0)
    d.ran_in(B)
    for zone in (A, B, C):
        zones.set_spot(zone, False)
    clock.now = T0 + timedelta(seconds=185)  # 115 s left: under work + 2 restarts
    assert d.decide_idle(0) is Decision.ON_DEMAND
    assert d.zone == B and d.launch_zones == (B, A, C)  # on-demand costs the same anywhere
    assert policy_events(ledger)[-1].startswith(f"uniform-progress-mz: on-demand in {B} (")
    assert "spot in no zone" in policy_events(ledger)[-1]


def test_running_on_demand_it_moves_to_another_zone_when_spot_is_there(ledger: Ledger) -> None:
    clock = Clock()
    zones = three_zones()
    zones.set_spot(A, False)
    zones.set_spot(B, False)
    d = driver(ledger, zones, clock)
    measure(d, 0)
    d.decide_idle(0)  # spot in C
    d.commit(Decision.ON_DEMAND, A)
    d.ran_in(A)
    clock.now = T0 + timedelta(seconds=30)
    move = d.tick("on-demand", 100, A)
    assert isinstance(move, PlannedMove)
    assert (move.source, move.to, move.zone) == (Decision.ON_DEMAND, Decision.SPOT, C)
    assert move.describe().startswith(f"on-demand -> spot in {C} (work left 75 s")
    # On spot in C, a cheaper zone with spot does not move it: a running spot node is kept.
    d.commit(move.to, move.zone)
    zones.set_spot(A, None)
    assert d.tick("spot", 120, C) is None
    assert stored(ledger).ran_in == C


def test_a_provider_without_zones_is_one_zone(ledger: Ledger, tmp_path: Path) -> None:
    local = LocalProvider(Settings(home=tmp_path / "orch", local=LocalSettings(price_per_hour=OD)))
    d = driver(ledger, local, Clock())
    assert d.decide_idle(None) is Decision.SPOT
    assert (d.zone, d.launch_zones) == (None, None)  # the spec's zones: none on local nodes
    local.set_spot_available(False)
    assert d.decide_idle(None) is Decision.ON_DEMAND
    assert [m.split(";")[1] for m in policy_events(ledger)] == [
        " spot available, on nothing)",
        " spot unavailable, on nothing)",
    ]


def test_reading_the_zones() -> None:
    markets = (
        ZoneMarket(A, None, Decimal("1"), OD),
        ZoneMarket(B, False, Decimal("1"), OD),
        ZoneMarket(C, None, None, Decimal("3.50")),  # no spot offer fits there
    )
    reading = read_zones(
        markets, refused={A}, holding=None, default_prices=(Decimal("0.3"), Decimal(1))
    )
    assert reading.spot == (False, False, False)
    assert reading.spot_prices == (Decimal("1"), Decimal("1"), OD)
    assert reading.on_demand_price == OD
    held = read_zones(markets, refused={A}, holding=B, default_prices=(Decimal(0), Decimal(1)))
    assert held.spot == (False, True, False)  # spot the job holds counts as had
    assert launch_zones(reading, Decision.ON_DEMAND, C) == (C, A, B)
    assert launch_zones(reading, Decision.SPOT, A) == (A,)
    assert launch_zones(reading, Decision.WAIT, A) is None
    assert launch_zones(ZoneReading.single(spot=True, spot_price=OD, on_demand_price=OD),
                        Decision.SPOT, None) is None  # fmt: skip
    empty = read_zones((), refused=(), holding=None, default_prices=(Decimal("0.3"), OD))
    assert empty.zones == (None,) and empty.spot == (False,)
    inputs = reading.inputs(
        work=None, time_left_s=1.0, total_time_s=1.0, overhead_s=5.0, running=Running.NOTHING,
        checkpoint="elsewhere", decision_interval_s=1.0, spent_usd=None,
    )  # fmt: skip
    assert inputs.checkpoint is None and inputs.migration_s == 5.0
