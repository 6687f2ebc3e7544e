"""A controller that died after reading steps it had not yet written to the ledger (a job's step
is written every 2 s) left them in rank 0's log copy: the controller that adopts the run takes
them up, so the job ends with the step its run reached, not an older one. On the runner's fakes
(tests/support/runner_fakes.py: a real SQLite ledger, a fake provider, attempts without SSH)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.journal import Journal
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger
from orchestrator.providers.base import Instance
from tests.support.runner_fakes import (  # noqa: F401  (the fixtures)
    FakeProvider,
    assert_all_leases_closed,
    fake_provider,
    runner,
    scripted,
)
from tests.unit.control.run.test_early_replacement import JOB_ID, running_on_two_nodes


def running_job_left_by_a_dead_controller(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider, *, step: int, rank0_log: str
) -> tuple[Journal, list[Instance]]:
    """A job RUNNING on two fake nodes, its step in the ledger `step`, and `rank0_log` in rank
    0's log copy, as a controller killed at that moment leaves them; its journal and nodes."""
    journal, nodes = running_on_two_nodes(tmp_path, ledger, provider)
    ledger.update_job(JOB_ID, step=step, loss=0.5)
    logs = tmp_path / "orch" / "jobs" / JOB_ID / "logs"
    (logs / ".starts").mkdir(parents=True)
    rank0 = next(i for i in nodes if i.rank == 0)
    (logs / ".starts" / rank0.instance_id).write_text("0")
    (logs / "node-0.log").write_text(rank0_log)
    return journal, nodes


def running_on_two_nodes_with_a_copy(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> tuple[Journal, list[Instance]]:
    """Its last write was step 27; it had read steps 28 to 30."""
    lines = [f"[default0]:{json.dumps({'step': s, 'loss': 1 / s})}\n" for s in range(1, 31)]
    return running_job_left_by_a_dead_controller(
        tmp_path, ledger, provider, step=27, rank0_log="[orch] starting\n" + "".join(lines)
    )


def adopt_and_succeed(tmp_path: Path, ledger: Ledger, provider: FakeProvider) -> None:
    adopter = runner(tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))
    assert adopter.run().state is JobState.SUCCEEDED
    assert_all_leases_closed(ledger, provider)


def test_the_adopter_ends_the_job_at_the_step_the_dead_controller_had_read(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    running_on_two_nodes_with_a_copy(tmp_path, ledger, provider)
    adopt_and_succeed(tmp_path, ledger, provider)
    job = ledger.get_job(JOB_ID)
    assert job.step == 30 and job.loss == 1 / 30
    ended = [e for e in ledger.events(JOB_ID) if e.kind == "SUCCEEDED"]
    assert ended and ended[-1].step == 30


def test_a_stop_half_done_with_its_nodes_ended_ends_at_the_step_read(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    """The controller saw the run succeed, ended the nodes and died before writing the end:
    there is no node left to connect to, and the log copy still says where the run got."""
    journal, nodes = running_on_two_nodes_with_a_copy(tmp_path, ledger, provider)
    journal.stopping(StopOrder(JobState.SUCCEEDED, 0, ""))
    provider.terminate([i.instance_id for i in nodes])
    adopt_and_succeed(tmp_path, ledger, provider)
    assert ledger.get_job(JOB_ID).step == 30


def test_an_adopter_never_moves_the_step_back(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider
) -> None:
    running_job_left_by_a_dead_controller(
        tmp_path, ledger, provider, step=40, rank0_log='[default0]:{"step": 12}\n'
    )
    adopt_and_succeed(tmp_path, ledger, provider)
    assert ledger.get_job(JOB_ID).step == 40
