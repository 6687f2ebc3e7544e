"""A start that made no progress (the supervisor's `FailedStart`), through the runner on a real
ledger with fake nodes: restarted once on the same nodes, then the job fails with the reason
that names the hang; a stall ends the job as STALLED."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from orchestrator.control.money.stop_rules import StopOrder, stall_order
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.start_rules import FailedStart
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger, utcnow
from orchestrator.providers.base import NodeEnd
from tests.support.runner_fakes import (  # noqa: F401  (the fixtures)
    JOB_ID,
    FakeAttempt,
    FakeProvider,
    assert_all_leases_closed,
    fake_provider,
    fresh_attempts,
    killed_while_running,
    kinds,
    runner,
    scripted,
)

HUNG = FailedStart(
    "the start made no progress in 20 s (recovery.start_timeout 20 s): rank 1 on node 1 never "
    "reached the master 10.0.0.1:29500",
    "node 0: waiting | node 1: connecting",
)


def test_a_start_that_hangs_twice_is_restarted_once_on_the_same_nodes_then_fails(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    outcome = runner(tmp_path, ledger, provider, scripted(HUNG, HUNG)).run()

    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, 1)
    assert outcome.reason is not None
    assert outcome.reason.startswith(HUNG.reason)
    assert outcome.reason.endswith("the same after 1 restart(s) on the same nodes")
    events = kinds(ledger)
    assert events.count("START_FAILED") == 2 and events.count("PROVISIONING") == 1
    restart = events[events.index("START_FAILED") + 1 :]
    assert restart[0] == "RECOVERING" and restart.index("RUNNING") < restart.index("START_FAILED")
    failed = [e for e in ledger.events(JOB_ID) if e.kind == "START_FAILED"][0]
    assert "last lines: node 0: waiting" in failed.message
    (attempt,) = FakeAttempt.opened  # the same nodes, no launch, no recovery counted
    assert getattr(attempt, "cleared", None) == [0, 1]
    assert len(provider.requests) == 1 and ledger.get_job(JOB_ID).recoveries == 0
    assert_all_leases_closed(ledger, provider)


def test_a_restart_that_makes_progress_runs_on(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    stalled = stall_order(quiet_s=31, stall_timeout_s=30, step=12)
    assert stalled is not None
    outcome = runner(tmp_path, ledger, provider, scripted(HUNG, stalled)).run()

    assert (outcome.state, outcome.exit_code) == (JobState.STALLED, 5)
    job = ledger.get_job(JOB_ID)
    assert (job.state, job.exit_code) == (JobState.STALLED, 5)
    assert "stayed at step 12 for 31 s" in (job.reason or "")
    (attempt,) = FakeAttempt.opened
    assert attempt.stops, "a stalled run gets SIGTERM (its checkpoint) before its nodes end"
    assert_all_leases_closed(ledger, provider)


def test_each_start_after_progress_gets_its_own_restart(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    def lost() -> Interruption:
        return Interruption((1,), ("f-1-1",), "lost", "stopped answering", utcnow())

    done = stall_order(quiet_s=40, stall_timeout_s=30, step=3)
    assert done is not None

    supervise = scripted(HUNG, lost(), HUNG, done)
    outcome = runner(tmp_path, ledger, provider, supervise).run()

    assert outcome.state == JobState.STALLED  # the second hang was restarted, not failed
    assert kinds(ledger).count("START_FAILED") == 2


# --- a job whose guards stopped it while it had no controller ------------------------------------
def guards_ended(provider: FakeProvider, kinds_by_rank: dict[int, str]) -> None:
    """The nodes of the job's first launch powered themselves off, node 0 first, each with the
    decision its guard wrote."""
    ended = {}
    for rank, kind in kinds_by_rank.items():
        iid = f"f-1-{rank}"
        provider.running.pop(iid, None)
        ended[iid] = NodeEnd(utcnow() + timedelta(seconds=rank), kind, f"{kind} on node {rank}")
    provider.self_ended = lambda ids: {i: e for i, e in ended.items() if i in ids}  # type: ignore[method-assign]


def test_a_revived_controller_ends_a_job_its_guard_stopped_as_stalled(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    killed_while_running(tmp_path, ledger, provider)
    guards_ended(provider, {0: "stall", 1: "orphaned"})

    outcome = runner(tmp_path, ledger, provider, scripted()).run()

    assert (outcome.state, outcome.exit_code) == (JobState.STALLED, 5)
    assert "stall on node 0" in (outcome.reason or "")  # node 0's decision, not node 1's
    assert len(provider.requests) == 1  # nothing launched again


def test_nodes_that_only_followed_a_vanished_rank_0_are_recovered(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    killed_while_running(tmp_path, ledger, provider)
    provider.take("f-1-0")  # reclaimed without a word from its guard
    guards_ended(provider, {1: "orphaned"})

    outcome = runner(
        tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, ""))
    ).run()

    assert outcome.state is JobState.SUCCEEDED
    assert len(provider.requests) == 2 and ledger.get_job(JOB_ID).recoveries == 1
    assert_all_leases_closed(ledger, provider)
