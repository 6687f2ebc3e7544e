"""The deadline driver on a real ledger (SQLite) and the real local provider's spot capacity:
its decisions, the events and state it records, and the moves it asks the controller for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.ledger.store import Job, Lease, Ledger
from orchestrator.node.progress import Metrics
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.spec.model import JobSpec
from orchestrator.spot.driver import DeadlineDriver, PlannedMove, price_request
from orchestrator.spot.inputs import DriverState
from orchestrator.spot.policies import Decision

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
TOTAL = 400  # steps; at 4 steps/s: 100 s of work


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    return LocalProvider(
        Settings(home=tmp_path / "orch", local=LocalSettings(price_per_hour=Decimal("3.06")))
    )


def spec(policy: str = "uniform-progress", deadline: str = "300s") -> JobSpec:
    return JobSpec.model_validate(
        {"name": "dl", "workdir": ".", "run": "true", "deadline": deadline, "spot_policy": policy}
    )


def driver(
    ledger: Ledger, provider: LocalProvider, clock: Clock, job_spec: JobSpec | None = None
) -> DeadlineDriver:
    job_spec = job_spec or spec()
    try:
        job = ledger.get_job("dl-1")
    except Exception:
        job = ledger.add_job(
            Job(
                id="dl-1", name="dl", provider="local", nodes=1, gpus_per_node=1,
                spec_json=job_spec.model_dump_json(), spec_path="job.yaml", created_at=T0,
            )
        )  # fmt: skip
    return DeadlineDriver(
        job_id="dl-1",
        spec=job_spec,
        submitted_at=T0,
        ledger=ledger,
        provider=provider,
        launch_request=price_request("dl-1", job_spec),
        interval_s=1.0,
        overhead_prior_s=10.0,
        state=DriverState.from_json(job.policy_state),
        clock=clock,
    )


def measure(d: DeadlineDriver, step: int, start_s: float = 0.0) -> None:
    """Progress lines at 4 steps/s, from `step` on."""
    d.new_run()
    for i in range(4):
        d.observe(Metrics(step + 4 * i, total_steps=TOTAL), at_s=start_s + i)


def policy_events(ledger: Ledger) -> list[str]:
    return [e.message for e in ledger.events("dl-1") if e.kind == "POLICY"]


def test_until_the_work_is_known_it_takes_spot_when_it_can(
    ledger: Ledger, provider: LocalProvider
) -> None:
    d = driver(ledger, provider, Clock())
    assert d.decide_idle(None) is Decision.SPOT and d.launch_spot
    provider.set_spot_available(False)
    assert d.decide_idle(None) is Decision.ON_DEMAND and not d.launch_spot
    assert policy_events(ledger) == [
        "uniform-progress: spot (work left unknown until the trainer reports its step rate "
        "and total_steps)",
        "uniform-progress: on-demand (work left unknown until the trainer reports its step "
        "rate and total_steps)",
    ]
    stored = DriverState.from_json(ledger.get_job("dl-1").policy_state)
    assert stored.market is Decision.ON_DEMAND


def test_a_loose_deadline_waits_for_spot_and_a_tight_one_goes_on_demand(
    ledger: Ledger, provider: LocalProvider
) -> None:
    clock = Clock()
    d = driver(ledger, provider, clock)
    measure(d, 0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=20)  # 100 s of work, 280 s left: loose
    assert d.decide_idle(0) is Decision.WAIT
    assert d.decide_idle(0) is Decision.WAIT
    assert len(policy_events(ledger)) == 1  # only changes are recorded
    assert (
        "work left 100 s, time left 280 s, restart 10 s, spot unavailable"
        in (policy_events(ledger)[0])
    )
    clock.now = T0 + timedelta(seconds=166)  # 95 s of work, 134 s left: tight; the line starts
    assert d.decide_idle(20) is Decision.WAIT
    # behind the line, no spot; 5 s done and nothing billed: the savings ($0.0043) pay for
    # the move to on-demand and back to spot beyond the allowed restart at 3.06 ($0.0028)
    clock.now = T0 + timedelta(seconds=168)
    assert d.decide_idle(20) is Decision.ON_DEMAND
    assert DriverState.from_json(ledger.get_job("dl-1").policy_state).policy.line_start == (
        pytest.approx(166.0),
        0.05,
    )


def test_behind_the_line_without_savings_the_job_waits(
    ledger: Ledger, provider: LocalProvider
) -> None:
    """Nothing done, nothing billed: a move to on-demand and back would lose more than the
    allowed restart at the on-demand price, so the job waits for spot or the safety net."""
    clock = Clock()
    d = driver(ledger, provider, clock)
    measure(d, 0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=160)
    assert d.decide_idle(0) is Decision.WAIT
    clock.now = T0 + timedelta(seconds=162)
    assert d.decide_idle(0) is Decision.WAIT
    clock.now = T0 + timedelta(seconds=181)  # 119 s left: under work + 2 restarts
    assert d.decide_idle(0) is Decision.ON_DEMAND


def on_demand_behind_the_line(
    ledger: Ledger, provider: LocalProvider
) -> tuple[Clock, DeadlineDriver]:
    """A driver whose job went on-demand at 167 s, behind its line with no spot in sight."""
    clock = Clock()
    d = driver(ledger, provider, clock)
    measure(d, 0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=166)
    d.decide_idle(20)
    clock.now = T0 + timedelta(seconds=167)
    assert d.decide_idle(20) is Decision.ON_DEMAND
    return clock, d


def test_on_demand_moves_back_to_spot_as_soon_as_it_is_there(
    ledger: Ledger, provider: LocalProvider
) -> None:
    clock, d = on_demand_behind_the_line(ledger, provider)
    clock.now = T0 + timedelta(seconds=200)  # 200 steps: 50 s done, ahead, but no spot
    assert d.tick("on-demand", 200) is None
    provider.set_spot_available(True)
    clock.now = T0 + timedelta(seconds=170)  # spot, still behind the line: taken
    move = d.tick("on-demand", 24)
    assert isinstance(move, PlannedMove)
    assert (move.source, move.to) == (Decision.ON_DEMAND, Decision.SPOT)
    assert move.describe().startswith("on-demand -> spot (work left 94 s, time left 130 s")


def test_a_bill_above_what_the_progress_is_worth_keeps_the_job_on_demand_for_good(
    ledger: Ledger, provider: LocalProvider
) -> None:
    """As the test above, but the job has been billed far more than its progress would have
    cost on on-demand (restarts that came to nothing): the move back to spot, which pays only
    from savings, is not made, and on-demand stays for the rest of the job."""
    clock, d = on_demand_behind_the_line(ledger, provider)
    ledger.open_lease(  # 200 s at 3.06/h: $0.17, against 50 s of progress ($0.04)
        Lease(
            job_id="dl-1", cluster="dl-1", provider="local", instance_id="n-0", rank=0,
            market="on-demand", instance_type="local", price_per_hour=Decimal("3.06"),
            launched_at=T0,
        )
    )  # fmt: skip
    provider.set_spot_available(True)
    clock.now = T0 + timedelta(seconds=200)
    assert d.tick("on-demand", 200) is None  # spot up: but not paid for
    assert DriverState.from_json(ledger.get_job("dl-1").policy_state).policy.committed_on_demand
    clock.now = T0 + timedelta(seconds=210)
    assert d.tick("on-demand", 240) is None


def test_spot_nodes_held_are_kept_while_the_trace_says_no_spot(
    ledger: Ledger, provider: LocalProvider
) -> None:
    clock = Clock()
    d = driver(ledger, provider, clock)
    measure(d, 0)
    d.decide_idle(0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=100)
    assert d.tick("spot", 100) is None  # exploitation: a running spot node is kept
    assert d.tick(None, 100) is None  # no node: nothing to move


def test_no_move_while_the_run_finishes(ledger: Ledger, provider: LocalProvider) -> None:
    clock = Clock()
    d = driver(ledger, provider, clock, spec("spot-only"))
    measure(d, 0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=100)
    assert d.tick("on-demand", TOTAL) is None


def test_a_refused_spot_launch_is_seen_by_the_next_decision(
    ledger: Ledger, provider: LocalProvider
) -> None:
    d = driver(ledger, provider, Clock(), spec("greedy"))
    assert d.decide_idle(None) is Decision.SPOT
    d.spot_refused()
    assert d.decide_idle(None) is Decision.ON_DEMAND


def test_a_new_driver_goes_on_from_the_stored_state(
    ledger: Ledger, provider: LocalProvider
) -> None:
    clock = Clock()
    d = driver(ledger, provider, clock)
    measure(d, 0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=290)  # the safety net fires: on-demand for good
    assert d.decide_idle(0) is Decision.ON_DEMAND
    d.commit(Decision.ON_DEMAND)
    again = driver(ledger, provider, clock)
    assert again.state.policy.committed_on_demand and again.state.steps_per_s == 4.0
    provider.set_spot_available(True)
    assert again.decide_idle(0) is Decision.ON_DEMAND  # committed: spot no longer tempts it


def test_restart_overhead_comes_from_the_jobs_own_starts(
    ledger: Ledger, provider: LocalProvider
) -> None:
    clock = Clock()
    d = driver(ledger, provider, clock)
    measure(d, 0)
    provider.set_spot_available(False)
    clock.now = T0 + timedelta(seconds=20)
    d.decide_idle(0)
    assert "restart 10 s" in policy_events(ledger)[-1]  # the prior
    ledger.add_event("dl-1", "PROVISIONING")
    ledger.add_event("dl-1", "TRAINING")
    provider.set_spot_available(True)
    d.decide_idle(0)
    assert "restart 0 s" in policy_events(ledger)[-1]  # measured: a few milliseconds


def test_free_on_demand_makes_spot_not_pay(tmp_path: Path, ledger: Ledger) -> None:
    free = LocalProvider(Settings(home=tmp_path / "free"))  # price_per_hour 0: spot is 0 too
    d = driver(ledger, free, Clock(), spec("greedy"))
    assert d.decide_idle(None) is Decision.ON_DEMAND
