"""A noticed node's replacement is launched at the notice, beside the salvage, on the runner's
fakes (tests/support/runner_fakes.py: a real SQLite ledger, a fake provider, attempts without SSH);
and a new controller that finds two nodes for one rank keeps the one the run started on."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path
from typing import cast

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.config import Settings
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.early_replacement import split_duplicate_ranks
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import RunnerOptions
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.runner import JobRunner
from orchestrator.control.run.watching import Verdict
from orchestrator.errors import CapacityError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger, utcnow
from orchestrator.providers.base import Instance, LaunchRequest
from tests.support.runner_fakes import (  # noqa: F401  (the fixtures)
    FakeAttempt,
    FakeKeeper,
    FakeProvider,
    add_job,
    assert_all_leases_closed,
    fake_provider,
    fresh_attempts,
    in_turn,
    kinds,
    loaded_job,
    open_fake,
    runner,
    scripted,
)
from tests.support.waiting import wait_until

JOB_ID = "unit-1"
NOTICE_OPTIONS = RunnerOptions(stop_grace=30.0, final_pull_wait=20.0, launch_retries=0)


def notice_on_node_1(attempt: Attempt) -> Verdict:
    node = attempt.instances[1]
    soon = utcnow() + timedelta(seconds=120)
    return Interruption((1,), (node.instance_id,), "notice", "spot notice", utcnow(), soon)


class SlowSalvageKeeper(FakeKeeper):
    """The salvage's pull waits (up to 5 s) until the provider was asked for a second launch:
    it only ends early when the replacement is launched while the salvage runs."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__()
        self.provider = provider
        self.launches_seen: list[int] = []

    def finish(self, *, skip: object = (), wait_s: float = 60.0) -> None:
        with contextlib.suppress(AssertionError):  # what was launched by then is recorded
            wait_until(lambda: len(self.provider.requests) >= 2, "two launches", 5, interval=0.01)
        self.launches_seen.append(len(self.provider.requests))
        super().finish(wait_s=wait_s)


def test_the_replacement_is_launched_during_the_salvage_and_joins_the_restart(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    supervise = in_turn(notice_on_node_1, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    keeper = SlowSalvageKeeper(provider)
    loaded = loaded_job(tmp_path)
    the_runner = JobRunner(
        add_job(ledger, loaded), loaded, settings=Settings(home=tmp_path / "orch"),
        ledger=ledger, provider=provider,  # type: ignore[arg-type]
        options=NOTICE_OPTIONS, open_attempt=open_fake,
        keeper=cast(CheckpointKeeper, keeper), supervise=supervise,
    )  # fmt: skip
    outcome = the_runner.run()

    assert outcome.state is JobState.SUCCEEDED
    assert keeper.launches_seen[0] == 2  # the replacement was asked for before the pull ended
    assert len(provider.requests) == 2  # and it is the one the restart used: no third launch
    replacement = provider.requests[1]
    assert (replacement.count, replacement.ranks, replacement.zones) == (1, (1,), ("zone-0",))
    assert provider.terminated[0] == ["f-1-1"]  # the noticed node, after the salvage
    # its copy went to the replacement alone, on a connection of its own
    alone = [a for a in FakeAttempt.opened if [i.instance_id for i in a.instances] == ["f-2-1"]]
    assert len(alone) == 1 and alone[0].pushes == 1
    assert getattr(alone[0], "low_priority", False)  # under nice: the salvage goes first
    restarted = FakeAttempt.opened[-1]
    assert [i.instance_id for i in restarted.instances] == ["f-1-0", "f-2-1"]
    events = ledger.events(JOB_ID)
    order = [e.kind for e in events]
    launched_early = order.index("PROVISIONING", 1)
    assert launched_early < order.index("SALVAGED") < order.index("RECOVERING")
    assert "launched at the notice" in events[launched_early].message
    job = ledger.get_job(JOB_ID)
    assert job.recoveries == 1 and order.count("RUNNING") == 2
    assert len(ledger.leases(JOB_ID)) == 3  # 2 first, then the replacement: no other
    assert_all_leases_closed(ledger, provider)


class RefusesTheSecondLaunch(FakeProvider):
    def launch(self, request: LaunchRequest) -> list:
        if len(self.requests) == 1:
            self.requests.append(request)
            raise CapacityError("no spot capacity in zone-0 right now")
        return super().launch(request)


def test_an_early_launch_refused_for_capacity_is_tried_again_after_the_salvage(
    tmp_path: Path, ledger: Ledger
) -> None:
    provider = RefusesTheSecondLaunch(ledger.ledger_id)
    supervise = in_turn(notice_on_node_1, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    outcome = runner(tmp_path, ledger, provider, supervise, NOTICE_OPTIONS).run()

    assert outcome.state is JobState.SUCCEEDED
    assert len(provider.requests) == 3  # at the notice (refused), then after the salvage
    assert provider.requests[2].ranks == (1,)  # still the lost rank alone, beside node 0
    assert "WARNING" not in kinds(ledger)  # nothing was launched, so nothing had to end
    assert len(ledger.leases(JOB_ID)) == 3
    assert_all_leases_closed(ledger, provider)


def test_a_new_controller_ends_a_replacement_launched_early_for_a_running_node(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    """The controller died between the early launch and the restart: the job is RUNNING on
    its first nodes, and a second node of rank 1 runs beside them."""
    journal, old = running_on_two_nodes(tmp_path, ledger, provider)
    early = provider.launch(first_request(ledger, ranks=(1,)))
    journal.leased(early[0], provider="fake")

    adopter = runner(tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    adopter.run()

    assert provider.terminated[0] == [early[0].instance_id]  # the extra node, at adoption
    adopted = FakeAttempt.opened[0]
    assert [i.instance_id for i in adopted.instances] == [i.instance_id for i in old]
    assert any("launched early" in e.message for e in ledger.events(JOB_ID))
    assert_all_leases_closed(ledger, provider)


def running_on_two_nodes(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> tuple[Journal, list[Instance]]:
    """The job RUNNING on two fake nodes, as a controller killed then leaves it: its journal
    and the nodes."""
    first = runner(tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    journal = first.journal
    journal.provisioning("2 node(s)")
    nodes = provider.launch(first_request(ledger))
    for instance in nodes:
        journal.leased(instance, provider="fake")
    journal.syncing("")
    journal.running("", started_at=utcnow())
    return journal, nodes


def first_request(ledger: Ledger, ranks: tuple[int, ...] = (0, 1)) -> LaunchRequest:
    job = ledger.get_job(JOB_ID)
    return request(job.node_owner, ranks, ledger.ledger_id)


def request(job_id: str, ranks: tuple[int, ...], ledger_id: str) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id, cluster=job_id, count=len(ranks), gpus_per_node=1, public_key="k",
        ranks=ranks, ledger_id=ledger_id,
    )  # fmt: skip


def test_of_two_nodes_for_one_rank_the_first_launched_stays() -> None:
    provider = FakeProvider("ledger")
    old = provider.launch(request("j", (0, 1), "ledger"))
    provider.launched_ago = timedelta(seconds=-5)  # launched later
    newer = provider.launch(request("j", (1,), "ledger"))
    keep, extra = split_duplicate_ranks([newer[0], *reversed(old)])
    assert [i.instance_id for i in keep] == ["f-1-0", "f-1-1"]
    assert [i.instance_id for i in extra] == ["f-2-1"]
    assert split_duplicate_ranks(old) == (old, [])
