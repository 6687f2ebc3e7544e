"""When a restart falls back to the checkpoint before the one it resumed: the failure read as a
checkpoint that could not be loaded (real torchrun output), and the rule over the job's events.

tests/fixtures/torchrun_dcp_load.log is the node log of `torchrun --nproc-per-node 2 --tee 3
--no-python bash -c 'python load.py'` (gloo; paths shortened), where every rank calls
`dcp.load` on a `step-000088/` that has no `.metadata`: DCP's loader raises
`AssertionError: metadata is None; global metadata read failed: ...` on each rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.control.run.resume_fallback import FailedLoad, fallback_due
from orchestrator.node.failure import checkpoint_load_error, cluster_failure, failure_report
from orchestrator.spot.inputs import PROGRESS_EVENT
from tests.support.helpers import REPO

FIXTURES = REPO / "tests" / "fixtures"
DCP_LOAD = (FIXTURES / "torchrun_dcp_load.log").read_text()
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def report_of(log: str) -> str:
    return cluster_failure({0: log}, 0, 1)[1]


LOAD_REPORT = report_of(DCP_LOAD)
METADATA = (
    "AssertionError: metadata is None; global metadata read failed: [Errno 2] No such file or "
    "directory: 'ckpt/step-000088/.metadata'"
)


def test_a_dcp_load_that_finds_no_metadata_reads_as_a_checkpoint_load() -> None:
    error = checkpoint_load_error(LOAD_REPORT)
    assert error is not None and error.startswith(METADATA)


@pytest.mark.parametrize(
    "fixture", ["torchrun_root_cause.log", "torchrun_exit_abort.log", "torchrun_ddp_node0.log"]
)
def test_other_failures_do_not(fixture: str) -> None:
    # a ValueError of the script's, an abort at exit, a peer's connection reset
    assert checkpoint_load_error(report_of((FIXTURES / fixture).read_text())) is None


def rank_log(*lines: str) -> str:
    return "\n".join(f"[default0]:{line}" for line in lines) + "\n"


TRACE = "Traceback (most recent call last):"


@pytest.mark.parametrize(
    "lines",
    [
        (TRACE, '  File "/opt/venv/lib/torch/serialization.py", line 1040, in load',
         "    return _load(opened_zipfile)",
         "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
         "central directory"),
        (TRACE, '  File "train.py", line 30, in load_checkpoint', "    state = read(path)",
         "KeyError: 'model'"),
        (TRACE, '  File "train.py", line 12, in main',
         "RuntimeError: Error(s) in loading state_dict for Net: Missing key(s)"),
        (TRACE, '  File "/opt/venv/lib/safetensors/torch.py", line 311, in load_file',
         "safetensors_rust.SafetensorError: Error while deserializing header"),
    ],
)  # fmt: skip
def test_torch_load_safetensors_and_a_scripts_own_loader_read_as_loads(
    lines: tuple[str, ...],
) -> None:
    report = failure_report(0, "torchrun exited with code 1", rank_log(*lines))
    assert checkpoint_load_error(report) == lines[-1]


@pytest.mark.parametrize(
    "lines",
    [
        (TRACE, '  File "train.py", line 30, in save_checkpoint', "OSError: No space left"),
        (TRACE, '  File "train.py", line 9, in load_data', "FileNotFoundError: data.csv"),
        (TRACE, '  File "train.py", line 9, in main', "RuntimeError: CUDA out of memory"),
    ],
)  # fmt: skip
def test_a_save_a_data_loader_and_an_oom_do_not(lines: tuple[str, ...]) -> None:
    report = failure_report(0, "torchrun exited with code 1", rank_log(*lines))
    assert checkpoint_load_error(report) is None


def test_only_the_failing_ranks_part_counts_never_the_logs_tail() -> None:
    # the tail mentions a checkpoint being loaded; the failure itself is a ValueError
    log = rank_log("loading checkpoint step-000008", TRACE, '  File "t.py", line 3, in main',
                   "ValueError: boom")  # fmt: skip
    assert checkpoint_load_error(failure_report(0, "exited", log)) is None
    assert checkpoint_load_error("") is None


@dataclass
class E:
    kind: str
    at: datetime
    step: int | None = None


def started_run(resumed_step: int | None = 80, at: datetime = T0) -> list[E]:
    return [
        E("RUNNING", at - timedelta(minutes=30)),
        E("PREEMPTED", at - timedelta(minutes=2), 88),
        E("RECOVERING", at - timedelta(minutes=2), 88),
        E("RUNNING", at),
        E("RESUMED", at, resumed_step),
    ]


def test_a_restart_that_could_not_load_its_step_falls_back() -> None:
    due = fallback_due(LOAD_REPORT, started_run(), T0 + timedelta(seconds=40))
    assert due is not None and due.step == 80 and due.error.startswith(METADATA)
    assert isinstance(due, FailedLoad)


def test_no_fallback_for_another_failure_a_run_that_made_progress_or_a_late_one() -> None:
    soon = T0 + timedelta(seconds=40)
    assert fallback_due(report_of((FIXTURES / "torchrun_root_cause.log").read_text()),
                        started_run(), soon) is None  # fmt: skip
    progressed = [*started_run(), E(PROGRESS_EVENT, T0 + timedelta(seconds=20), 81)]
    assert fallback_due(LOAD_REPORT, progressed, soon) is None
    assert fallback_due(LOAD_REPORT, started_run(), T0 + timedelta(minutes=11)) is None
    assert fallback_due(LOAD_REPORT, started_run(), T0 + timedelta(minutes=9)) is not None


def test_no_fallback_without_a_resumed_step() -> None:
    soon = T0 + timedelta(seconds=40)
    assert fallback_due(LOAD_REPORT, started_run(resumed_step=None), soon) is None
    fresh = [E("RUNNING", T0)]  # started from scratch: nothing to fall back from
    assert fallback_due(LOAD_REPORT, fresh, soon) is None
    assert fallback_due(LOAD_REPORT, [], soon) is None


def test_once_per_interruption() -> None:
    after_fallback = [
        *started_run(),
        E("FALLBACK", T0 + timedelta(seconds=41), 76),
        E("RECOVERING", T0 + timedelta(seconds=41)),
        E("RUNNING", T0 + timedelta(seconds=60)),
        E("RESUMED", T0 + timedelta(seconds=60), 76),
    ]
    later = T0 + timedelta(seconds=90)
    assert fallback_due(LOAD_REPORT, after_fallback, later) is None
    # a new interruption later: its restart may fall back again
    again = [
        *after_fallback,
        E(PROGRESS_EVENT, T0 + timedelta(seconds=70), 77),
        E("PREEMPTED", T0 + timedelta(hours=1), 200),
        E("RUNNING", T0 + timedelta(hours=1, minutes=1)),
        E("RESUMED", T0 + timedelta(hours=1, minutes=1), 196),
    ]
    due = fallback_due(LOAD_REPORT, again, T0 + timedelta(hours=1, minutes=2))
    assert due is not None and due.step == 196
