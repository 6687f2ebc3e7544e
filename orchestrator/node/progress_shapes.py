"""Steps read from the shapes common training output takes, for a run that prints no step line
of its own (pure). What orch shows and records for such a run; never what its start and stall
timeouts judge (`run_progress`: a run without step lines progresses while rank 0 prints).

Recognised, in rank 0's lines (torchrun's prefix removed), where a step can be told for sure:

- a progress bar whose description is an epoch (PyTorch Lightning's `Epoch 3:  45%|...| 23/50
  [00:01<00:01, 20.1it/s, loss=0.123]`, a tqdm loop with `desc=f"epoch {n}"`): the step is the
  epoch, `loss=` of its postfix the loss;
- a progress bar without a description that is the run's only one (Hugging Face Trainer's
  ` 12/500 [00:03<01:40, ...]`): the step is its count. A bar that restarts with the same total
  is the same loop's next pass (the step counts on: passes x total + count); a second bar with
  another total (an evaluation loop, a bar of another kind) makes the bars ambiguous, and they
  give no step for the rest of the run. Nested bars (drawn with a cursor-up sequence, as
  tqdm draws a bar below another: Hugging Face's evaluation) are never read;
- a line that starts with `Epoch N` or `epoch N/M` (after an optional `[tag]`, as the PyTorch
  DDP tutorial's `[GPU0] Epoch 3 | Batchsize: 32 | Steps: 64`): the step is N, a `loss`
  value on the line the loss;
- Hugging Face Trainer's log dicts (`{'loss': 0.5, 'learning_rate': ..., 'epoch': 1.0}`, the
  values quoted in transformers 5): the loss and epoch of the step last read.

The first of these shapes that gives a step is the run's: the others are not read after it,
and its step never goes back within the run (a lower one is not reported), so two shapes of one
output cannot take turns. The samples in tests/fixtures/progress/ are the real output of each.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

MAX_SHAPE_LINE = 1000  # a longer line is no progress bar or epoch line: not looked at

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_BAR = re.compile(  # tqdm's `{desc}: {percent}|{bar}| {n}/{total} [{elapsed}<...`
    r"^(?P<desc>[^|]*?)(?::\s*)?\s*\d{1,3}%\|[^|]*\|\s*(?P<n>\d{1,18})/(?P<total>\d{1,18}|\?)\s+\["
)
_EPOCH_DESC = re.compile(r"^\s*epoch\s*(?P<epoch>\d{1,9})(?:\s*/\s*\d{1,9})?\s*$", re.IGNORECASE)
_POSTFIX_LOSS = re.compile(rf"(?<![\w.])loss=(?P<loss>{_NUMBER})")
_EPOCH_LINE = re.compile(
    r"^\s*(?:\[[^\]]{1,40}\]\s*)?epoch\s*[:=#]?\s*(?P<epoch>\d{1,9})"
    r"(?:\s*(?:/|of)\s*\d{1,9})?(?![\w.])",
    re.IGNORECASE,
)
_LINE_LOSS = re.compile(rf"(?<![\w.])loss\s*[:=]?\s*(?P<loss>{_NUMBER})(?![\w.])", re.IGNORECASE)
_HF_LOG = re.compile(r"^\s*\{'[a-z_]+': .*\}\s*$")
_HF_VALUE = r"'{key}': '?(?P<value>{number})'?[,}}]"
_HF_LOSS = re.compile(_HF_VALUE.format(key="loss", number=_NUMBER))
_HF_EPOCH = re.compile(_HF_VALUE.format(key="epoch", number=_NUMBER))
_CURSOR_UP = re.compile("[\x1b\ufffd]\\[A")  # a nested bar is drawn so (U+FFFD: ESC made printable)

EPOCH_BAR, BAR, EPOCH_LINE = "epoch bar", "bar", "epoch line"


class ShapeProgress(NamedTuple):
    """What a line's shape told: the run's step, and its epoch and loss when known."""

    step: int
    epoch: float | None
    loss: float | None


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


class ShapeReader:
    """Reads the steps of one run from its output's shape: `read(text)` for each line of
    rank 0, in order; a new run gets a new reader."""

    def __init__(self) -> None:
        self.shape: str | None = None  # the run's shape, once one gave a step
        self.step: int | None = None  # the last step reported
        self.loss: float | None = None  # the last loss read (with the step or on its own)
        self.epoch: float | None = None
        self._total: int | None = None  # the count of the run's bar without a description
        self._passes = 0  # times that bar restarted
        self._count = 0  # its last count
        self._bars_ambiguous = False

    def read(self, text: str) -> ShapeProgress | None:
        """The progress `text` reports (a step, or a loss for the last step), or None."""
        if len(text) > MAX_SHAPE_LINE:
            return None
        if _HF_LOG.match(text):
            return self._log_dict(text)
        bar = _BAR.match(text) if "%|" in text else None
        if bar is not None:
            if _CURSOR_UP.search(text):
                return None
            desc = _EPOCH_DESC.match(bar["desc"])
            if desc is not None:
                loss = _POSTFIX_LOSS.search(text)
                return self._found(EPOCH_BAR, int(desc["epoch"]), loss and loss["loss"])
            if bar["desc"].strip() or bar["total"] == "?":
                return None
            return self._bar(int(bar["n"]), int(bar["total"]))
        line = _EPOCH_LINE.match(text)
        if line is not None:
            loss = _LINE_LOSS.search(text, line.end())
            return self._found(EPOCH_LINE, int(line["epoch"]), loss and loss["loss"])
        return None

    def _log_dict(self, text: str) -> ShapeProgress | None:
        loss = _HF_LOSS.search(text)
        if loss is None:  # an evaluation's or the summary's dict: no training loss
            return None
        self.loss = _number(loss["value"])
        epoch = _HF_EPOCH.search(text)
        self.epoch = _number(epoch["value"]) if epoch else self.epoch
        return None if self.step is None else self._metrics()

    def _bar(self, count: int, total: int) -> ShapeProgress | None:
        if self._bars_ambiguous or total < 1 or count > total:
            return None
        if self._total is None:
            self._total = total
        elif total != self._total:
            self._bars_ambiguous = True
            return None
        elif count < self._count:
            self._passes += 1
        self._count = count
        return self._found(BAR, self._passes * total + count, None)

    def _found(self, shape: str, step: int, loss: str | None) -> ShapeProgress | None:
        if self.shape not in (None, shape):
            return None
        if self.step is not None and step < self.step:
            return None
        self.shape, self.step = shape, step
        if loss is not None:
            self.loss = _number(loss)
        if shape != BAR:
            self.epoch = float(step)
        return self._metrics()

    def _metrics(self) -> ShapeProgress:
        assert self.step is not None  # only called once a step was read
        return ShapeProgress(self.step, self.epoch, self.loss)
