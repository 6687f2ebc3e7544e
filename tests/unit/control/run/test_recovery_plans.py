"""What a recovery step returns: the next launch as a value (`Fresh`, `ReplaceLost`), with
what had to end already ended; on the runner's fakes (tests/support/runner_fakes.py: a real
SQLite ledger, a fake provider, attempts without SSH)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from orchestrator.control.run.early_replacement import EarlyLaunch
from orchestrator.control.run.recovering import Fresh, ReplaceLost
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.runner import JobRunner
from orchestrator.errors import CapacityError, JobFailed
from orchestrator.ledger.store import Ledger, utcnow
from orchestrator.providers.base import Instance
from tests.support.runner_fakes import (  # noqa: F401  (the fixture)
    JOB_ID,
    FakeAttempt,
    FakeProvider,
    fresh_attempts,
    runner,
    scripted,
)


def running(tmp_path: Path, ledger: Ledger, provider: FakeProvider, **spec: object) -> JobRunner:
    """A runner whose run is up on two nodes (f-1-0, f-1-1)."""
    the_runner = runner(tmp_path, ledger, provider, scripted(), **spec)
    the_runner.launcher.claim_identity()
    the_runner.bring_up.start()
    return the_runner


def lose_node_1(the_runner: JobRunner, provider: FakeProvider) -> Interruption:
    gone = the_runner.attempt.instances[1]
    provider.take(gone.instance_id)
    return Interruption((1,), (gone.instance_id,), "lost", "stopped answering", utcnow())


def test_a_lost_node_gives_a_plan_that_keeps_the_node_that_stays(
    tmp_path: Path, ledger: Ledger
) -> None:
    provider = FakeProvider(ledger.ledger_id)
    the_runner = running(tmp_path, ledger, provider)
    plan = the_runner.recovery.recover(lose_node_1(the_runner, provider))

    assert isinstance(plan, ReplaceLost) and plan.early is None
    assert [i.instance_id for i in plan.survivors] == ["f-1-0"]
    assert provider.terminated == [["f-1-1"]]  # the lost node ended at once, the other runs
    assert not the_runner.attempt.instances  # the next launch is the plan's, not a field's
    assert ledger.get_job(JOB_ID).recoveries == 1

    the_runner.bring_up.start(plan)
    assert [(r.count, r.ranks) for r in provider.requests] == [(2, ()), (1, (1,))]
    assert [i.instance_id for i in the_runner.attempt.instances] == ["f-1-0", "f-2-1"]


def test_replace_all_gives_a_fresh_launch_away_from_the_zone_that_took_the_node(
    tmp_path: Path, ledger: Ledger
) -> None:
    provider = FakeProvider(ledger.ledger_id)
    the_runner = running(tmp_path, ledger, provider, recovery={"replace": "all"})
    plan = the_runner.recovery.recover(lose_node_1(the_runner, provider))

    assert plan == Fresh(avoid_zones=("zone-1",))
    assert provider.terminated == [["f-1-0", "f-1-1"]]
    assert not provider.running


def test_no_recovery_left_gives_no_plan_and_ends_nothing(tmp_path: Path, ledger: Ledger) -> None:
    provider = FakeProvider(ledger.ledger_id)
    the_runner = running(tmp_path, ledger, provider, recovery={"max_recoveries": 0})
    with pytest.raises(JobFailed, match="no recovery left"):
        the_runner.recovery.recover(lose_node_1(the_runner, provider))
    assert provider.terminated == []


def test_an_early_launch_is_a_future_of_the_replacements(tmp_path: Path, ledger: Ledger) -> None:
    provider = FakeProvider(ledger.ledger_id)
    the_runner = running(tmp_path, ledger, provider)
    survivor = the_runner.attempt.instances[0]
    replacement = the_runner.attempt.instances[1]
    copied: list[list[Instance]] = []

    def launch(launched: object) -> list[Instance]:
        return [replacement]

    early = EarlyLaunch.start([survivor], launch, copied.append)
    assert isinstance(early.future, Future)
    assert early.future.result(timeout=10) == [replacement] == early.usable_for([survivor])
    assert copied == [[replacement]] and early.error is None

    def refused(launched: object) -> list[Instance]:
        raise CapacityError("no capacity in zone-0")

    failed = EarlyLaunch.start([survivor], refused, copied.append)
    assert failed.usable_for([survivor]) is None
    assert isinstance(failed.error, CapacityError)  # no failure of the job: launched again

    def bug(launched: object) -> list[Instance]:
        raise ValueError("a bug in the launch")

    with pytest.raises(ValueError, match="a bug"):
        EarlyLaunch.start([survivor], bug, copied.append).wait()  # raised in the caller
