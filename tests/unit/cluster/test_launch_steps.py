"""A start step that fails on the nodes names itself and says what to do: the job's reason
reads "STEP failed: what the node said" with the step's advice (or the error's own), and the
error keeps its class. The runner is driven with in-memory nodes (`runner_fakes`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.cluster.steps import node_step
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.errors import NodeUnreachable, RemoteError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger
from tests.support import runner_fakes
from tests.support.runner_fakes import (
    JOB_ID,
    FakeAttempt,
    FakeProvider,
    lose_node_1_then_succeed,
    runner,
    scripted,
)

LOADED = runner_fakes.loaded_job


def failing(message: str, hint: str | None = None):  # noqa: ANN201
    def fail(*args: object, **kwargs: object) -> None:
        raise RemoteError(message, hint=hint)

    return fail


@pytest.mark.parametrize(
    ("method", "step"),
    [
        ("push", "sync of the workdir to the nodes failed: "),
        ("start", "start of the run on the nodes failed: "),
        ("free_port", "search for a free port on node 0 (torchrun's rendezvous) failed: "),
    ],
)
def test_a_failed_start_step_is_named_with_what_to_do(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, method: str, step: str
) -> None:
    said = "node-1: command exited 23:\nrsync: send_files failed: Permission denied (13)"
    monkeypatch.setattr(FakeAttempt, method, failing(said))
    provider = FakeProvider(ledger.ledger_id)
    outcome = runner(
        tmp_path, ledger, provider, scripted(StopOrder(JobState.SUCCEEDED, 0, ""))
    ).run()
    assert outcome.state is JobState.FAILED
    reason = outcome.reason or ""
    assert reason.startswith(step + said), reason
    assert "\n  -> " in reason and "submit again" in reason


def test_a_step_keeps_the_errors_class_its_own_advice_and_the_innermost_name() -> None:
    outer, inner = node_step("outer step", "outer advice"), node_step("inner step", "inner")
    with pytest.raises(NodeUnreachable) as caught, outer, inner:
        raise NodeUnreachable("node-0: no answer", hint="the node may be gone")
    assert caught.value.message == "inner step failed: node-0: no answer"
    assert caught.value.hint == "the node may be gone"
    assert caught.value.step == "inner step"


class Recorder:
    """Connections that record the commands the controller runs on the nodes."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def map(self, fn):  # noqa: ANN001, ANN201
        return [fn(rank, self) for rank in range(2)]

    def run(self, command: str, **kwargs: object) -> None:
        self.commands.append(command)


def test_fresh_clears_left_out_files_on_the_nodes_before_the_first_start_only(
    tmp_path: Path, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery's nodes may hold the run's own snapshot.pt (a survivor): only the first
    sync, before any run wrote one, removes what --fresh leaves out."""
    recorder = Recorder()
    monkeypatch.setattr(FakeAttempt, "cluster", property(lambda self: recorder))
    monkeypatch.setattr(
        runner_fakes, "loaded_job",
        lambda tmp, **f: dataclasses.replace(LOADED(tmp, **f), left_out=("snapshot.pt",)),
    )  # fmt: skip
    provider = FakeProvider(ledger.ledger_id)
    outcome = runner(tmp_path, ledger, provider, lose_node_1_then_succeed(provider)).run()
    assert outcome.state is JobState.SUCCEEDED, outcome.reason
    assert sum(1 for e in ledger.events(JOB_ID) if e.kind == "SYNCED") == 2
    removals = [c for c in recorder.commands if "snapshot.pt" in c]
    assert len(removals) == 2  # the first sync, on each of the 2 nodes; none at the recovery
