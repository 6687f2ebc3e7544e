"""The runner's branching, on a real ledger (SQLite in tmp_path) with a fake provider, fake
attempts (no SSH) and a scripted supervisor: what each path leaves in the ledger (state,
events, leases) and asks of the provider."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest
from sqlmodel import Session, select

from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.journal import IllegalTransition, Journal
from orchestrator.control.run.options import RunnerOptions, SilentReporter
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.runner import JobRunner
from orchestrator.control.run.watching import Verdict
from orchestrator.errors import CapacityError, RemoteError
from orchestrator.job_state import FINAL_STATES, TRANSITIONS, JobState, may_follow
from orchestrator.ledger.store import Lease, Ledger, utcnow
from orchestrator.node import launch
from orchestrator.providers.base import (
    Instance,
    LaunchRequest,
    ZoneMarket,
)
from orchestrator.spec.model import LoadedJob
from orchestrator.spot.inputs import DriverState
from orchestrator.spot.policies import Decision as Market
from tests.support.runner_fakes import (  # noqa: F401  (the fixtures)
    JOB_ID,
    FakeAttempt,
    FakeKeeper,
    FakeProvider,
    FakeWatch,
    add_job,
    assert_all_leases_closed,
    fake_provider,
    fresh_attempts,
    in_turn,
    killed_while_running,
    kinds,
    loaded_job,
    lose_node_1_then_succeed,
    runner,
    scripted,
)


# --- the runner's paths -----------------------------------------------------------------------
def test_a_launch_refused_for_capacity_fails_the_job_with_nothing_leased(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    provider.capacity = False
    outcome = runner(tmp_path, ledger, provider, scripted()).run()

    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, CapacityError.exit_code)
    assert "no capacity for the fake nodes" in (outcome.reason or "")
    job = ledger.get_job(JOB_ID)
    assert job.state == JobState.FAILED and job.ended_at is not None
    assert kinds(ledger) == ["PROVISIONING", "STOPPING", "FAILED"]
    assert ledger.leases(JOB_ID) == []
    assert FakeAttempt.opened == []


def test_a_node_lost_mid_run_is_replaced_alone_beside_the_node_that_stays(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    supervise = lose_node_1_then_succeed(provider)
    the_runner = runner(tmp_path, ledger, provider, supervise, setup="pip install -e .")
    keeper = cast(FakeKeeper, the_runner.keeper)
    outcome = the_runner.run()

    assert (outcome.state, outcome.exit_code) == (JobState.SUCCEEDED, 0)
    job = ledger.get_job(JOB_ID)
    assert job.state == JobState.SUCCEEDED and job.recoveries == 1
    events = kinds(ledger)
    assert events.count("PROVISIONING") == 2 and events.count("RUNNING") == 2
    assert events.index("PREEMPTED") < events.index("SALVAGED") < events.index("RECOVERING")
    assert "RESUMED" in events  # a recovery always says where it resumed from
    assert [r.attempt for r in provider.requests] == [0, 1]  # fresh launch tokens
    replacement = provider.requests[1]
    assert (replacement.count, replacement.ranks) == (1, (1,))  # the lost rank alone
    assert replacement.zones == ("zone-0",) and replacement.instance_types == ("fake.gpu",)
    assert keeper.finished[0] == ({1}, 0)  # salvage asked only the node that answers
    assert provider.terminated[0] == ["f-1-1"]  # the lost node alone, at once
    first, second = FakeAttempt.opened[-2:]
    assert getattr(first, "cleared", None) == [0]  # the survivor's run cleared for the restart
    assert [i.instance_id for i in second.instances] == ["f-1-0", "f-2-1"]  # by rank
    # the same setup digest both times: a node skips a setup it already ran (the survivor)
    assert first.launch.setup_key is not None
    assert second.launch.setup_key == first.launch.setup_key
    leases = ledger.leases(JOB_ID)
    assert len(leases) == 3  # the survivor's lease runs on: its boot is not paid again
    assert [lease.instance_id for lease in leases if lease.rank == 0] == ["f-1-0"]
    assert_all_leases_closed(ledger, provider)


def test_a_node_taken_during_the_sync_is_replaced_alone_and_counts_as_a_recovery(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes: list[int] = []

    def push(
        attempt: FakeAttempt,
        loaded: LoadedJob,
        layout: launch.NodeLayout,
        *,
        low_priority: bool = False,
        timeout: float | None = None,
    ) -> int:
        pushes.append(len(attempt.instances))
        if len(pushes) == 1:  # the cloud takes node 1 while its workdir is being sent
            provider.take(attempt.instances[1].instance_id)
            raise RemoteError("rsync to node 1: connection closed")
        return len(attempt.instances)

    monkeypatch.setattr(FakeAttempt, "push", push)
    outcome = runner(
        tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, ""))
    ).run()

    assert outcome.state == JobState.SUCCEEDED
    job = ledger.get_job(JOB_ID)
    assert job.recoveries == 1 and pushes == [2, 2]
    (preempted,) = [e for e in ledger.events(JOB_ID) if e.kind == "PREEMPTED"]
    assert "while the job started" in preempted.message
    assert [(r.count, r.ranks) for r in provider.requests] == [(2, ()), (1, (1,))]
    assert len(ledger.leases(JOB_ID)) == 3
    assert_all_leases_closed(ledger, provider)


class WaitingDriver:
    """A spot policy that says spot, then (after the recovery) wait once, then spot again."""

    def __init__(self) -> None:
        self.decisions = [Market.SPOT, Market.WAIT]
        self.market: Market | None = None
        self.name = "fake"
        self.launch_zones = None  # a single-zone policy

    def decide_idle(self, step: int | None) -> Market:
        return self.decisions.pop(0) if self.decisions else Market.SPOT

    def commit(self, decision: Market, zone: str | None = None) -> None:
        self.market = decision

    @property
    def launch_spot(self) -> bool:
        return self.market is Market.SPOT

    def new_run(self) -> None:
        pass

    def spot_refused(self, zone: str | None = None) -> None:
        pass

    def ran_in(self, zone: str | None) -> None:
        pass


def test_a_policy_that_waits_after_a_loss_ends_the_nodes_that_stayed(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    """Waiting means no node billed: the survivors of the loss end before the wait."""

    supervise = lose_node_1_then_succeed(provider)

    options = RunnerOptions(
        stop_grace=0.0, final_pull_wait=0.0, launch_retries=0, launch_backoff=0.0,
        policy_interval=0.01,
    )  # fmt: skip
    the_runner = runner(tmp_path, ledger, provider, supervise, options, driver=WaitingDriver())

    assert the_runner.run().state == JobState.SUCCEEDED
    assert [(r.count, r.ranks) for r in provider.requests] == [(2, ()), (2, ())]
    waiting = kinds(ledger).index("WAITING")
    ended = [e for e in ledger.events(JOB_ID) if e.kind == "TERMINATED"]
    assert len(ended) == 3  # the lost node, the survivor before the wait, the last two
    assert ledger.events(JOB_ID).index(ended[1]) < waiting  # nothing billed while waiting
    assert provider.terminated[:2] == [["f-1-1"], ["f-1-0"]]
    assert_all_leases_closed(ledger, provider)


def test_replace_all_replaces_every_node_of_the_run(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    supervise = lose_node_1_then_succeed(provider)

    outcome = runner(tmp_path, ledger, provider, supervise, recovery={"replace": "all"}).run()

    assert outcome.state == JobState.SUCCEEDED
    assert [(r.count, r.ranks) for r in provider.requests] == [(2, ()), (2, ())]
    assert provider.requests[1].avoid_zones == ("zone-1",)  # the zone that took the node
    assert provider.terminated[0] == ["f-1-0", "f-1-1"]
    assert len(ledger.leases(JOB_ID)) == 4
    assert_all_leases_closed(ledger, provider)


def test_with_no_capacity_for_the_replacement_the_whole_cluster_moves(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    def no_capacity() -> None:
        provider.capacity = False  # the zone has nothing left ...

    def refused_once(request: LaunchRequest) -> list[Instance]:
        if request.ranks:  # ... for the replacement; the whole launch elsewhere gets nodes
            provider.requests.append(request)
            raise CapacityError("no capacity in zone-0")
        provider.capacity = True
        return FakeProvider.launch(provider, request)

    provider.launch = refused_once  # type: ignore[method-assign]
    supervise = lose_node_1_then_succeed(provider, then=no_capacity)

    outcome = runner(tmp_path, ledger, provider, supervise).run()

    assert outcome.state == JobState.SUCCEEDED
    assert [(r.count, r.ranks) for r in provider.requests] == [(2, ()), (1, (1,)), (2, ())]
    assert provider.requests[2].avoid_zones == ("zone-0",)  # the zone that had no capacity
    assert ["f-1-0"] in provider.terminated  # the survivor ended before the move
    events = ledger.events(JOB_ID)
    assert any("the whole cluster moves" in e.message for e in events if e.kind == "WARNING")
    assert_all_leases_closed(ledger, provider)


@dataclass
class ZonedProvider(FakeProvider):
    """Nodes in the zone a launch asks for first (zone-a without one); spot cheapest in
    zone-a, and refused in the zones of `no_spot`. Answers `zone_markets` as EC2 would:
    prices per zone, spot availability unknown."""

    no_spot: set[str] = field(default_factory=set)

    def zone_markets(self, request: LaunchRequest) -> tuple[ZoneMarket, ...]:
        return tuple(
            ZoneMarket(zone, None, Decimal(price), self.price)
            for zone, price in (("zone-a", "1.00"), ("zone-b", "1.10"))
        )

    def launch(self, request: LaunchRequest) -> list[Instance]:
        zone = request.zones[0] if request.zones else "zone-a"
        if request.spot is True and zone in self.no_spot:
            self.requests.append(request)
            raise CapacityError(f"no spot capacity in {zone}")
        launched = [replace(i, zone=zone) for i in FakeProvider.launch(self, request)]
        self.running.update({i.instance_id: i for i in launched})
        return launched


def test_a_zone_aware_policy_moves_the_cluster_to_another_zones_spot_when_its_zone_has_none(
    tmp_path: Path, ledger: Ledger
) -> None:
    """uniform-progress-mz: node 1 is lost while zone-a sells no more spot; the replacement
    is refused there, and the policy sends the whole cluster to zone-b's spot (not to
    on-demand, and not to the provider's own choice of zone)."""
    provider = ZonedProvider(ledger.ledger_id)
    supervise = lose_node_1_then_succeed(provider, then=lambda: provider.no_spot.add("zone-a"))
    the_runner = runner(
        tmp_path, ledger, provider, supervise, deadline="1h", spot_policy="uniform-progress-mz"
    )

    assert the_runner.run().state == JobState.SUCCEEDED
    asked = [(r.count, r.ranks, r.spot, r.zones, r.zones_ordered) for r in provider.requests]
    assert asked == [
        (2, (), True, ("zone-a",), True),
        (1, (1,), True, ("zone-a",), False),  # beside the survivor, in its zone: refused
        (2, (), True, ("zone-b",), True),
    ]
    assert ["f-1-0"] in provider.terminated  # the survivor ended before the move
    policy = [e.message for e in ledger.events(JOB_ID) if e.kind == "POLICY"]
    assert [m.split(" (")[0] for m in policy] == [
        "uniform-progress-mz: spot in zone-a",
        "uniform-progress-mz: spot in zone-b",
    ]
    assert "none in zone-a" in policy[1] and "checkpoint in zone-a" in policy[1]
    state = DriverState.from_json(ledger.get_job(JOB_ID).policy_state)
    assert (state.market, state.zone, state.ran_in) == (Market.SPOT, "zone-b", "zone-b")
    assert_all_leases_closed(ledger, provider)


def test_a_spot_notice_salvages_with_a_checkpoint_then_relaunches(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    def notice(attempt: Attempt) -> Verdict:
        node = attempt.instances[0]
        soon = utcnow() + timedelta(seconds=120)
        return Interruption((0,), (node.instance_id,), "notice", "spot notice", utcnow(), soon)

    supervise = in_turn(notice, lambda a: StopOrder(JobState.SUCCEEDED, 0, ""))

    options = RunnerOptions(stop_grace=30.0, final_pull_wait=20.0, launch_retries=0)
    the_runner = runner(tmp_path, ledger, provider, supervise, options)
    keeper = cast(FakeKeeper, the_runner.keeper)
    outcome = the_runner.run()

    assert outcome.state is JobState.SUCCEEDED
    first = FakeAttempt.opened[0]
    assert first.stops and 0 < first.stops[0] <= 30.0  # SIGTERM: the trainers checkpoint
    skip, wait = keeper.finished[0]
    assert skip == set() and wait > 0  # after a notice every node still answers
    preempted = [e for e in ledger.events(JOB_ID) if e.kind == "PREEMPTED"]
    assert len(preempted) == 1 and preempted[0].message.startswith("notice: ")
    assert ledger.get_job(JOB_ID).recoveries == 1
    assert_all_leases_closed(ledger, provider)


def test_the_budget_reached_stops_the_job_with_the_budget_reason(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    provider.price = Decimal("36")  # $0.01/s per node
    provider.launched_ago = timedelta(minutes=10)  # 2 nodes x 600 s: $12 spent already
    holder: list[JobRunner] = []

    def supervise(attempt: Attempt) -> Verdict:
        attempt.watch = cast(Any, FakeWatch(len(attempt.instances)))
        order = holder[0].supervisor.check_budget(attempt)  # the real check, on the ledger
        assert order is not None
        return order

    the_runner = runner(tmp_path, ledger, provider, supervise, budget={"max_cost_usd": 5})
    holder.append(the_runner)
    outcome = the_runner.run()

    assert (outcome.state, outcome.exit_code) == (JobState.BUDGET_STOPPED, 4)
    job = ledger.get_job(JOB_ID)
    assert job.state == JobState.BUDGET_STOPPED
    assert job.reason is not None and "budget.max_cost_usd $5" in job.reason
    final = ledger.events(JOB_ID)[-1]
    assert (final.kind, final.message) == ("BUDGET_STOPPED", job.reason)
    assert FakeAttempt.opened[0].stops  # not a success: the trainers got their SIGTERM
    assert_all_leases_closed(ledger, provider)


def test_a_new_controller_adopts_the_running_job_of_one_that_was_killed(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    killed_while_running(tmp_path, ledger, provider, claimed=True)  # on 2 nodes
    assert ledger.get_job(JOB_ID).state == JobState.RUNNING
    ledger.update_job(JOB_ID, step=42)

    adopting = runner(tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    keeper = cast(FakeKeeper, adopting.keeper)
    outcome = adopting.run()

    assert outcome.state is JobState.SUCCEEDED
    assert len(provider.requests) == 1  # training never stopped: nothing launched again
    adopted = FakeAttempt.opened[-1]
    assert adopted.started and adopted.pushes == 0  # the run was taken over, not restarted
    assert keeper.adopted == 1
    events = ledger.events(JOB_ID)
    adoption = [e for e in events if e.kind == "ADOPTED"]
    assert len(adoption) == 1 and "took over 2 node(s)" in adoption[0].message
    assert adoption[0].step == 42
    assert "RECOVERING" not in kinds(ledger)
    assert ledger.get_job(JOB_ID).state == JobState.SUCCEEDED
    assert_all_leases_closed(ledger, provider)


def test_an_adopted_job_whose_node_vanished_meanwhile_is_recovered(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    killed_while_running(tmp_path, ledger, provider)
    provider.take(FakeAttempt.opened[0].instances[1].instance_id)  # reclaimed, no controller

    adopting = runner(tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    outcome = adopting.run()

    assert outcome.state is JobState.SUCCEEDED
    assert len(provider.requests) == 2
    preempted = [e for e in ledger.events(JOB_ID) if e.kind == "PREEMPTED"]
    assert len(preempted) == 1 and preempted[0].message.startswith("preempted: ")
    assert ledger.get_job(JOB_ID).recoveries == 1
    assert_all_leases_closed(ledger, provider)


def test_an_adopted_job_missing_a_rank_without_a_lease_replaces_that_rank(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    """A job rebuilt from its nodes after its ledger died (`control.repair.rebuild`) has no lease
    for a
    rank whose node ended before: the new controller must not run on one node of two."""
    killed_while_running(tmp_path, ledger, provider)
    gone = FakeAttempt.opened[0].instances[1].instance_id
    provider.take(gone)
    with Session(ledger.engine) as session:  # the rebuilt ledger never knew that node
        for row in session.exec(select(Lease).where(Lease.instance_id == gone)):
            session.delete(row)
        session.commit()

    adopting = runner(tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    outcome = adopting.run()

    assert outcome.state is JobState.SUCCEEDED
    assert len(provider.requests) == 2
    assert provider.requests[1].node_ranks == (1,)  # node 0 stayed: only rank 1 launched
    adopted = FakeAttempt.opened[1]
    assert adopted.stops and "SALVAGED" in kinds(ledger)  # what node 0 holds was collected
    lost = [e for e in ledger.events(JOB_ID) if e.kind == "PREEMPTED"]
    assert len(lost) == 1 and "node 1" in lost[0].message, lost
    assert ledger.get_job(JOB_ID).recoveries == 1
    assert_all_leases_closed(ledger, provider)


# --- the journal and its transition table -----------------------------------------------------
def test_the_journal_refuses_an_illegal_transition_and_writes_nothing(
    tmp_path: Path, ledger: Ledger
) -> None:
    job = add_job(ledger, loaded_job(tmp_path))
    journal = Journal(job, ledger, SilentReporter())

    with pytest.raises(IllegalTransition):
        journal.running("too soon", started_at=utcnow())
    assert ledger.get_job(JOB_ID).state == JobState.PENDING
    assert ledger.events(JOB_ID) == []

    journal.provisioning("2 node(s)")
    journal.syncing("workdir")
    journal.running("torchrun", started_at=datetime(2026, 1, 1, tzinfo=UTC))
    journal.stopping(StopOrder(JobState.SUCCEEDED, 0, ""))
    journal.ended(StopOrder(JobState.SUCCEEDED, 0, ""), ended_at=utcnow(), step=7)
    job = ledger.get_job(JOB_ID)
    assert (job.state, job.stop_state, job.step) == (JobState.SUCCEEDED, "SUCCEEDED", 7)
    assert kinds(ledger) == ["PROVISIONING", "SYNCING", "RUNNING"]
    with pytest.raises(IllegalTransition):
        journal.provisioning("a finished job never starts again")
    assert ledger.get_job(JOB_ID).state == JobState.SUCCEEDED


def test_the_transition_table() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for state in JobState:
        assert may_follow(state, JobState.STOPPING) is not state.is_final
    for final in FINAL_STATES:
        assert TRANSITIONS[final] == frozenset()
        assert may_follow(JobState.STOPPING, final)
        assert not may_follow(JobState.RUNNING, final)  # an end always goes through STOPPING
    assert not may_follow(JobState.PENDING, JobState.RUNNING)
    assert not may_follow(JobState.RUNNING, JobState.PROVISIONING)  # recovery comes first
    assert may_follow(JobState.RUNNING, JobState.RECOVERING)
    assert may_follow(JobState.RECOVERING, JobState.PROVISIONING)
    assert may_follow(JobState.RUNNING, JobState.SWITCHING)
