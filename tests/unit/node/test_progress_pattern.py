"""`progress: {pattern: REGEX}`: the steps of a script that prints plain text, read from the
real output of PyTorch's multinode DDP tutorial (tests/fixtures/progress/), checked in the
spec, and held by the controller's run watch and the node guard alike."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cluster.run_watch import RunWatch
from orchestrator.node.guard_protocol import GuardLease
from orchestrator.node.progress import Metrics, ProgressReader, parse_metrics
from orchestrator.node.run_progress import ProgressClock, compile_pattern, step_of
from orchestrator.spec.loading import load_job
from orchestrator.spec.model import JobSpec
from tests.unit.cluster.test_run_pace import FakeNode
from tests.unit.cluster.test_run_pace import watch_of as node_watch
from tests.unit.node.test_run_progress import RunNode
from tests.unit.spec_cases import MINIMAL, spec_error, write

PROGRESS = Path(__file__).resolve().parents[2] / "fixtures" / "progress"
TUTORIAL = r"\[GPU\d+\] Epoch (?P<step>\d+) \| Batchsize"
# the tutorial's `--total-epochs` is not on its lines: a pattern over a line that has it
EPOCHS = r"[Ee]poch (?P<step>\d+)/(?P<total>\d+),? loss[ =]*(?P<loss>[0-9.]+)"


def watch_of(
    log: Path, tmp_path: Path, **options: object
) -> tuple[RunWatch, list[Metrics], list[str]]:
    """A run watch of one node whose log is the fixture `log`, with the watch's `options`."""
    return node_watch([FakeNode(log.read_text())], tmp_path, **options)


def test_a_plain_text_scripts_epochs_are_its_steps_with_a_pattern(tmp_path: Path) -> None:
    """The run watch reads rank 0's lines of the tutorial's node log with the job's pattern:
    its epochs are the job's steps, the other ranks' and the other lines are not."""
    tutorial = PROGRESS / "ddp_tutorial.node.log"
    watch, metrics, lines = watch_of(tutorial, tmp_path, progress_pattern=TUTORIAL)
    watch.tick()
    assert [(m.step, m.step_line) for m in metrics] == [(e, True) for e in range(4)]
    assert "[GPU0] Epoch 3 | Batchsize: 32 | Steps: 4" in lines  # the job's own line is shown
    assert watch.clock.steps and watch.clock.step == 3  # the clock counts its epochs alone

    resumed = PROGRESS / "ddp_tutorial_resumed.node.log"
    watch, metrics, _ = watch_of(resumed, tmp_path / "resumed", progress_pattern=TUTORIAL)
    watch.tick()
    assert [m.step for m in metrics] == [2, 3, 4, 5]  # not "Resuming ... at Epoch 2"


def test_a_patterns_total_and_loss_are_read_and_json_lines_no_longer_count() -> None:
    pattern = compile_pattern(EPOCHS)
    metrics = parse_metrics("Epoch 2/10, loss 0.912", pattern)
    assert metrics is not None
    assert (metrics.step, metrics.total_steps, metrics.loss) == (2, 10, 0.912)
    assert parse_metrics('{"step": 7, "loss": 0.1}', pattern) is None
    assert parse_metrics("epoch 3/0, loss .", pattern) is not None  # a total of 0 is none
    assert parse_metrics("epoch 3/0, loss .", pattern).total_steps is None  # type: ignore[union-attr]
    # The step is plain digits, and only the first PATTERN_SPAN characters are searched.
    digits = compile_pattern(r"step (?P<step>\S+)")
    assert step_of("step ٣", digits) is None and step_of("step 12", digits) == 12
    assert step_of("x" * 600 + "step 12", digits) is None
    reader = ProgressReader(TUTORIAL)
    assert reader.read("[GPU0] Epoch 0 | Batchsize: 32 | Steps: 4") is not None
    assert reader.read("100%|##########| 5/5 [00:00<00:00]") is None  # no shapes with a pattern


def test_the_clock_judges_a_start_and_a_stall_by_the_patterns_lines() -> None:
    clock = ProgressClock(0.0, pattern=compile_pattern(TUTORIAL))
    clock.feed("[default0]:Loading snapshot", 1.0)
    clock.feed("[default0]:Resuming training from snapshot at Epoch 2", 2.0)
    assert clock.step is None and not clock.steps
    clock.feed("[default0]:[GPU0] Epoch 2 | Batchsize: 32 | Steps: 4", 3.0)
    assert (clock.step, clock.progress_at) == (2, 3.0)
    clock.feed("[default0]:Epoch 2 | Training snapshot saved at snapshot.pt", 9.0)
    assert clock.due(33.0, 20, 30) == ("stall", 33.0, 30.0)  # chatter is not a step


def test_the_node_guard_holds_the_pattern_of_the_terms_and_of_a_kept_clusters_lease(
    tmp_path: Path,
) -> None:
    node = RunNode(tmp_path / "boot", stall_timeout_s=30.0, progress_pattern=TUTORIAL)
    node.heartbeat(age_s=3600)  # no controller: the guard judges
    node.start(rank=0)
    now = time.time()  # after the run's start (its pid file's time)
    node.log("[default0]:[GPU0] Epoch 0 | Batchsize: 32 | Steps: 4")
    assert node.guard.due(now) is None
    node.log(*["[default0]:Epoch 0 | Training snapshot saved at snapshot.pt"] * 3)
    assert node.guard.due(now + 29) is None
    kind, _, message = node.guard.due(now + 30)
    assert kind == "stall" and "step (0)" in message

    kept = RunNode(tmp_path / "kept", autostop=True, deadman_s=600.0)
    kept.heartbeat(age_s=3600)
    lease = GuardLease(
        renewed_at=datetime.now(UTC), runtime_deadline=None, lease_until=None, job_limits=True,
        stall_timeout_s=30.0, progress_pattern=TUTORIAL,
    )  # fmt: skip
    kept.write_lease(lease.for_node(job_id="j-1", clock_offset_s=0.0, sign=kept.key.sign))
    kept.start(rank=0)
    now = time.time()
    kept.log("[default0]:[GPU0] Epoch 4 | Batchsize: 32 | Steps: 4", "[default0]:chatter")
    assert kept.guard.due(now) is None
    assert kept.guard.due(now + 30)[0] == "stall"
    assert kept.guard.progress.clock.step == 4


def test_a_progress_section_is_checked_with_the_spec(project: Path) -> None:
    spec = load_job(write(project, MINIMAL + f"progress: {{pattern: '{TUTORIAL}'}}\n")).spec
    assert spec.progress.pattern == TUTORIAL
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert load_job(write(project, MINIMAL + "progress:\n")).spec.progress.pattern is None
    for pattern, said in [
        ("Epoch (\\d+)", "has no group named step"),
        ("Epoch (?P<step>\\d+", "is not a regular expression"),
        ("Epoch (?P<step>\\d+) (?P<lr>[0-9.]+)", "has a group named lr"),
        ("(?:(?P<step>\\d+) )+", "repeats a part that itself repeats"),
        ("(?P<step>\\d+)(?:a|ab)*", "repeats a part that itself repeats"),
        ("x" * 501 + "(?P<step>1)", "longer than 500"),
    ]:
        message = spec_error(write(project, MINIMAL + "progress:\n  pattern: '" + pattern + "'\n"))
        assert re.search(r"progress\.pattern\W.*line 5", message), message
        assert said in message, message
    message = spec_error(write(project, MINIMAL + "progress: {patern: x}\n"))
    assert "did you mean `pattern`?" in message
