"""The runner's fallback after a restart that could not load its checkpoint, on a real ledger
with the fakes of tests/support/runner_fakes.py: it holds the checkpoint back and restarts once
on the same nodes from the one before; a second such failure, or nothing to fall back to,
fails the job."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from orchestrator.cluster.checkpoints.keeper import Resume
from orchestrator.cluster.checkpoints.records import Newest
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.watching import Verdict
from orchestrator.errors import JobFailed
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger
from orchestrator.node.failure import cluster_failure
from tests.support.helpers import REPO
from tests.support.runner_fakes import (  # noqa: F401  (the fixtures)
    JOB_ID,
    FakeAttempt,
    FakeKeeper,
    FakeProvider,
    assert_all_leases_closed,
    fake_provider,
    fresh_attempts,
    in_turn,
    kinds,
    runner,
    scripted,
)

LOAD_FAILURE = cluster_failure(
    {0: (REPO / "tests" / "fixtures" / "torchrun_dcp_load.log").read_text()}, 0, 1
)[1]


class ResumingKeeper(FakeKeeper):
    """Holds complete checkpoints of `steps` (newest last): each start resumes the newest
    not held back."""

    def __init__(self, steps: Collection[int]) -> None:
        super().__init__()
        self.steps = sorted(steps)
        self.held: list[int] = []
        self.restarts: list[object] = []

    def prepare(self, cluster: object, **access: object) -> Resume:
        self.restarts.append(access.get("restart"))
        if not self.steps:
            return Resume("", None)
        name = f"step-{self.steps[-1]:06d}"
        return Resume(f"ckpt/{name}", self.steps[-1], name)

    def hold_back(self) -> Newest | None:
        step = self.steps.pop()
        self.held.append(step)
        return Newest(f"step-{step:06d}", step)

    def newest(self) -> Newest | None:  # type: ignore[override]
        return Newest(f"step-{self.steps[-1]:06d}", self.steps[-1]) if self.steps else None


def cannot_load(attempt: Attempt) -> Verdict:
    raise JobFailed(LOAD_FAILURE, hint="full log: orch logs")


def test_a_run_that_cannot_load_its_step_restarts_once_on_the_same_nodes_from_the_one_before(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    keeper = ResumingKeeper([76, 80])
    succeed = scripted(StopOrder(JobState.SUCCEEDED, 0, ""))
    outcome = runner(tmp_path, ledger, provider, in_turn(cannot_load, succeed), keeper=keeper).run()

    assert outcome.state == JobState.SUCCEEDED, outcome
    assert keeper.held == [80]
    events = ledger.events(JOB_ID)
    names = kinds(ledger)
    assert names.count("RUNNING") == 2 and names.count("FALLBACK") == 1
    (fallback,) = [e for e in events if e.kind == "FALLBACK"]
    assert fallback.step == 76
    assert "could not load step-000080 (AssertionError: metadata is None" in fallback.message
    assert "from step-000076" in fallback.message
    resumed = [e.step for e in events if e.kind == "RESUMED"]
    assert resumed == [80, 76]
    after = names[names.index("FALLBACK") :]
    assert after[:3] == ["FALLBACK", "RECOVERING", "PROVISIONING"]
    provisioning = [e.message for e in events if e.kind == "PROVISIONING"]
    assert provisioning[-1] == "no node to launch: the run restarts on its 2 node(s)"
    assert len(provider.requests) == 1  # nothing launched for the fallback
    first, second = FakeAttempt.opened[0], FakeAttempt.opened[-1]
    assert getattr(first, "cleared", None) == [0, 1]  # what was left of the run cleared
    assert [i.instance_id for i in second.instances] == [i.instance_id for i in first.instances]
    assert ledger.get_job(JOB_ID).recoveries == 0  # no node was lost
    assert_all_leases_closed(ledger, provider)


def test_the_fallback_is_tried_once(tmp_path: Path, ledger: Ledger, provider: FakeProvider) -> None:
    keeper = ResumingKeeper([72, 76, 80])
    outcome = runner(
        tmp_path, ledger, provider, in_turn(cannot_load, cannot_load), keeper=keeper
    ).run()

    assert outcome.state == JobState.FAILED
    assert "metadata read failed" in (outcome.reason or "")
    assert kinds(ledger).count("FALLBACK") == 1 and keeper.held == [80]
    assert_all_leases_closed(ledger, provider)


def test_with_nothing_before_it_the_job_fails_and_says_so(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    keeper = ResumingKeeper([80])
    outcome = runner(tmp_path, ledger, provider, in_turn(cannot_load), keeper=keeper).run()

    assert outcome.state == JobState.FAILED
    assert "FALLBACK" not in kinds(ledger)
    warnings = [e.message for e in ledger.events(JOB_ID) if e.kind == "WARNING"]
    assert any("no complete checkpoint before it to fall back to" in w for w in warnings)
    assert_all_leases_closed(ledger, provider)
