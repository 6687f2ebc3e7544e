"""Without `progress.pattern`, the steps of common training output are read where they can be
told for sure: the real output of PyTorch Lightning (tqdm and rich bars), the Hugging Face
Trainer (transformers 4 and 5), a tqdm loop and the PyTorch DDP tutorial, as torchrun tees it
into a node log, recorded in tests/fixtures/progress/ (README.md there says how)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.node.progress import Metrics, ProgressReader
from orchestrator.node.progress_shapes import ShapeReader
from tests.unit.node.test_progress_pattern import PROGRESS, watch_of


def distinct(metrics: list[Metrics]) -> list[tuple[int, float | None]]:
    """(step, loss) of each report, repeats dropped."""
    seen: list[tuple[int, float | None]] = []
    for m in metrics:
        if not seen or seen[-1] != (m.step, m.loss):
            seen.append((m.step, m.loss))
    return seen


def read_lines(name: str, tmp_path: Path, **options: object) -> list[Metrics]:
    """What the run watch reports of a fixture's lines when it reads them one check each
    (the last shape read by a check is reported)."""
    text = (PROGRESS / name).read_text()
    watch, metrics, _ = watch_of(PROGRESS / name, tmp_path, **options)
    node = watch.cluster.connections[0]
    node.log = ""  # type: ignore[attr-defined]
    for line in text.splitlines(keepends=True):
        node.log += line  # type: ignore[attr-defined]
        watch.tick()
    return metrics


@pytest.mark.parametrize(
    ("fixture", "steps"),
    [
        ("ddp_tutorial.node.log", [0, 1, 2, 3]),  # `[GPU0] Epoch N | Batchsize: 32 | ...`
        ("ddp_tutorial_resumed.node.log", [2, 3, 4, 5]),
        ("lightning_tqdm_bar.node.log", [0, 1, 2]),  # `Epoch N: 40%|...| 2/5 [..., loss=]`
        ("lightning_rich_bar.node.log", [2]),  # rich's bar, written once off a terminal
        ("tqdm_epochs.node.log", [0, 1]),  # tqdm(desc=f"epoch {n}")
        ("hf_trainer_v4.node.log", [0, 5, 10, 15]),  # the Trainer's bar, n/max_steps
        ("hf_trainer_v5.node.log", [0, 5, 10, 15]),
    ],
)
def test_the_steps_of_common_output_are_read_without_a_pattern(
    fixture: str, steps: list[int], tmp_path: Path
) -> None:
    metrics = read_lines(fixture, tmp_path)
    assert sorted({m.step for m in metrics}) == steps
    assert [m.step for m in metrics] == sorted(m.step for m in metrics)  # never back
    assert not any(m.step_line for m in metrics)  # shown and recorded, never a step line


def test_losses_come_from_the_bars_postfix_and_the_trainers_log_dicts(tmp_path: Path) -> None:
    lightning = distinct(read_lines("lightning_tqdm_bar.node.log", tmp_path / "l"))
    assert lightning[:3] == [(0, None), (0, 0.442), (0, 2.08)]  # loss=, never val_loss=
    assert lightning[-1] == (2, 0.439)
    assert distinct(read_lines("lightning_rich_bar.node.log", tmp_path / "r")) == [(2, 0.439)]
    for version, losses in (("v4", [0.9695, 0.9692, 0.969]), ("v5", [1.201] * 3)):
        metrics = read_lines(f"hf_trainer_{version}.node.log", tmp_path / version)
        logged = [m for m in metrics if m.loss is not None]
        assert [m.loss for m in logged] == losses  # `'loss'`, never `'eval_loss'`
        assert [m.epoch for m in logged] == [1.0, 2.0, 3.0] and {m.step for m in logged} == {15}


def test_a_launcher_of_its_own_writes_carriage_returns_which_end_its_lines(
    tmp_path: Path,
) -> None:
    metrics = read_lines("tqdm_epochs.raw.log", tmp_path, unprefixed_is_rank0=True)
    assert sorted({m.step for m in metrics}) == [0, 1]  # each redraw a line of its own


def test_shapes_that_cannot_be_told_for_sure_give_no_step() -> None:
    reader = ShapeReader()
    for text in [
        "Resuming training from snapshot at Epoch 12",  # not where an epoch line starts
        "Epochs: 10",
        "Map: 100%|##########| 1000/1000 [00:00<00:00, 5000.00 examples/s]",  # a named bar
        "Validation DataLoader 0:  50%|#####     | 1/2 [00:00<00:00, 1764.54it/s]",
        " 40%|####      | 2/5 [00:00<00:00, 17.2it/s]\x1b[A",  # nested: drawn under another
        " 40%|####      | 2/5 [00:00<00:00, 17.2it/s]\ufffd[A",
        "Training: |          | 0/? [00:00<?, ?it/s]",
        "{'eval_loss': 0.96, 'epoch': 1.0}",
        "{'loss': 0.5, 'epoch': 1.0}",  # a loss, but no step read yet
        "epoch" + " 1" * 600,  # longer than a progress line
    ]:
        assert reader.read(text) is None, text
    assert reader.step is None


def test_a_bar_without_a_name_is_the_runs_only_while_it_is_the_only_one() -> None:
    one_loop = ShapeReader()
    counts = [1, 2, 3, 1, 2, 3, 1]  # the same loop's next passes: the step counts on
    read = [one_loop.read(f" 50%|#  | {n}/3 [00:01<00:01, 2.0it/s]") for n in counts]
    assert [r.step for r in read if r is not None] == [1, 2, 3, 4, 5, 6, 7]
    two_loops = ShapeReader()
    assert two_loops.read(" 50%|#  | 4/8 [00:01<00:01]") is not None
    assert two_loops.read(" 50%|#  | 1/2 [00:01<00:01]") is None  # an evaluation loop?
    assert two_loops.read(" 62%|#  | 5/8 [00:01<00:01]") is None  # then no bar is trusted
    assert two_loops.step == 4


def test_the_first_shape_that_gives_a_step_is_the_runs() -> None:
    reader = ShapeReader()
    assert reader.read("epoch 0:  25%|##  | 5/20 [00:00<00:00, 48.18it/s]").step == 0  # type: ignore[union-attr]
    assert reader.read("Epoch 1/2, loss 0.912") is None  # another shape: not read
    assert reader.read("epoch 1:  25%|##  | 5/20 [00:00<00:00, 48.18it/s]").step == 1  # type: ignore[union-attr]
    lines = ShapeReader()
    assert lines.read("[GPU0] Epoch 3 | Batchsize: 32 | Steps: 4").step == 3  # type: ignore[union-attr]
    assert lines.read("epoch 2/10 loss=0.25") is None  # a step never goes back in a run
    assert lines.read("Epoch 4: loss 0.125").loss == 0.125  # type: ignore[union-attr]


def test_json_step_lines_take_over_from_shapes_for_the_rest_of_the_run() -> None:
    reader = ProgressReader()
    assert reader.read("Epoch 1 | starting").step == 1  # type: ignore[union-attr]
    json_step = reader.read('{"step": 40, "loss": 0.3}')
    assert json_step is not None and json_step.step_line and reader.step_lines
    assert reader.read("Epoch 2 | starting") is None


def test_steps_from_shapes_leave_the_clock_judging_a_run_by_its_lines(tmp_path: Path) -> None:
    """A job whose ledger holds a step (made the clock count step lines alone) but that prints
    no step line: its lines are its progress, as the node guard, which never reads shapes,
    judges it too."""
    watch, metrics, _ = watch_of(PROGRESS / "ddp_tutorial.node.log", tmp_path)
    watch.clock.steps = True  # a step recorded before, as after a restart or a takeover
    watch.tick()
    assert [m.step for m in metrics] == [3]  # the last of the check
    assert not watch.clock.steps and watch.clock.progress_at is not None
