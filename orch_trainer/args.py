"""Command-line flags of `python -m orch_trainer.train`, parsed into a frozen `TrainConfig`.

Contract:
- `parse_args(argv, environ)` never exits and never prints: every problem raises `UsageError`
  with a one-line message (argparse's usage dump is suppressed), which `train.main` reports
  as `trainer: error: <message>` with exit status 2. `--help` still prints help and exits 0.
- `--checkpoint-dir` defaults to `$ORCH_CHECKPOINT_DIR`; unset or empty means no checkpoints
  (so does an explicit `--checkpoint-dir ''`).
- `--steps N` sets the number of optimizer steps to run in total (counting steps done before a
  resume); when `--epochs` is given as well, the run stops at whichever comes first. With
  neither, one epoch is run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

from orch_trainer.errors import UsageError

MODEL_NAMES = ("tiny", "resnet18")
AMP_MODES = ("auto", "bf16", "fp16", "off")
DataKind = Literal["fake", "cifar10", "folder"]


@dataclass(frozen=True)
class DataSpec:
    """A parsed `--data` value."""

    kind: DataKind  # which loader
    path: Path | None  # folder on disk; None for fake

    def __str__(self) -> str:
        if self.kind == "fake":
            return "fake"
        prefix = "cifar10:" if self.kind == "cifar10" else ""
        return f"{prefix}{self.path}"


def parse_data_spec(text: str) -> DataSpec:
    """`fake`, `cifar10:/dir` or a folder path; raise `UsageError` on an empty path."""
    if text == "fake":
        return DataSpec("fake", None)
    if text.startswith("cifar10:"):
        rest = text.removeprefix("cifar10:")
        if not rest:
            raise UsageError("cifar10 needs a folder: --data cifar10:/path/to/cifar")
        return DataSpec("cifar10", Path(rest).expanduser())
    if not text:
        raise UsageError("--data needs a value: fake, cifar10:/dir or an ImageFolder /dir")
    return DataSpec("folder", Path(text).expanduser())


@dataclass(frozen=True)
class TrainConfig:
    """Everything the flags decide. Sizes are per rank unless the name says global."""

    model: str  # one of MODEL_NAMES
    data: DataSpec  # where the samples come from
    fake_size: int  # number of samples of the `fake` data set
    num_classes: int  # classes of the `fake` data set (others know their own)
    image_size: int  # side of the square images fed to the model
    epochs: int | None  # epochs to run; None: 1 unless --steps is given
    steps: int | None  # total optimizer steps to reach; None: run the epochs
    batch_size: int  # samples per rank per micro-step
    accum: int  # micro-steps per optimizer step (gradient accumulation)
    lr: float  # learning rate at a global batch of 256 (scaled linearly)
    momentum: float  # SGD momentum
    weight_decay: float  # SGD weight decay
    warmup_steps: int | None  # linear warmup length; None: 5% of the run
    seed: int  # model init, data order, fake data
    amp: str  # one of AMP_MODES; resolved against the device at start
    deterministic: bool  # force deterministic kernels
    checkpoint_dir: Path | None  # None: no checkpoints at all
    checkpoint_every: int  # save every N optimizer steps; 0: off
    checkpoint_seconds: float  # save when this much time passed since the last save; 0: off
    keep: int  # complete checkpoints kept in checkpoint_dir
    resume: str  # "auto", "none" or a path to a step-* directory or its state.pt
    timeout: float  # seconds a collective may wait for a peer before the job fails
    workers: int  # DataLoader worker processes per rank
    log_every: int  # print a JSON progress line every N optimizer steps
    record_samples: Path | None  # debug: each rank appends consumed sample indices here
    stop_after: int | None  # debug: act as if SIGTERM arrived during step N


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    convert.__name__ = f"integer >= {minimum}"
    return convert


def _float_at_least(minimum: float, *, strict: bool = False) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or value < minimum or (strict and value == minimum):
            relation = "greater than" if strict else "at least"
            raise argparse.ArgumentTypeError(f"must be {relation} {minimum}, got {text}")
        return value

    convert.__name__ = "number"
    return convert


def _data_spec(text: str) -> DataSpec:
    try:
        return parse_data_spec(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The flag definitions (also used to render --help)."""
    p = _Parser(
        prog="python -m orch_trainer.train",
        description="Reference DDP trainer of orch (run it under torchrun, or alone).",
        allow_abbrev=False,
    )
    pos, nonneg = _int_at_least(1), _int_at_least(0)
    p.add_argument("--model", choices=MODEL_NAMES, default="resnet18")
    p.add_argument(
        "--data",
        type=_data_spec,
        default=parse_data_spec("fake"),
        help="fake | cifar10:/dir (local, never downloaded) | /dir (ImageFolder)",
    )
    p.add_argument("--fake-size", type=pos, default=10_000, help="samples of --data fake")
    p.add_argument("--num-classes", type=_int_at_least(2), default=10, help="for --data fake")
    p.add_argument("--image-size", type=_int_at_least(8), default=32)
    p.add_argument("--epochs", type=pos, default=None)
    p.add_argument("--steps", type=pos, default=None, help="total optimizer steps")
    p.add_argument("--batch-size", type=pos, default=32, help="per rank, per micro-step")
    p.add_argument("--accum", type=pos, default=1, help="micro-steps per optimizer step")
    p.add_argument(
        "--lr",
        type=_float_at_least(0.0, strict=True),
        default=0.1,
        help="learning rate at a global batch of 256",
    )
    p.add_argument("--momentum", type=_float_at_least(0.0), default=0.9)
    p.add_argument("--weight-decay", type=_float_at_least(0.0), default=5e-4)
    p.add_argument("--warmup-steps", type=nonneg, default=None)
    p.add_argument("--seed", type=nonneg, default=0)
    p.add_argument("--amp", choices=AMP_MODES, default="auto")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="default: $ORCH_CHECKPOINT_DIR; unset or empty: no checkpoints",
    )
    p.add_argument("--checkpoint-every", type=nonneg, default=0, help="steps; 0: off")
    p.add_argument("--checkpoint-seconds", type=_float_at_least(0.0), default=600.0, help="0: off")
    p.add_argument("--keep", type=pos, default=3, help="complete checkpoints to keep")
    p.add_argument("--resume", default="auto", help="auto | none | PATH")
    p.add_argument(
        "--timeout",
        type=_float_at_least(0.0, strict=True),
        default=60.0,
        help="seconds to wait for a peer in a collective",
    )
    p.add_argument("--workers", type=nonneg, default=2, help="DataLoader workers per rank")
    p.add_argument("--log-every", type=pos, default=10)
    p.add_argument(
        "--record-samples",
        default=None,
        metavar="FILE_PREFIX",
        help="debug: append consumed sample indices to FILE_PREFIX.rank<R>.jsonl",
    )
    p.add_argument(
        "--stop-after",
        type=pos,
        default=None,
        metavar="STEP",
        help="debug: stop after STEP as if SIGTERM had arrived",
    )
    return p


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> TrainConfig:
    """Parse flags; raise `UsageError` with a one-line message on any problem."""
    ns = build_parser().parse_args(argv)
    dir_text: str | None = ns.checkpoint_dir
    if dir_text is None:
        dir_text = environ.get("ORCH_CHECKPOINT_DIR", "")
    checkpoint_dir = Path(dir_text).expanduser() if dir_text else None
    if not ns.resume:
        raise UsageError("argument --resume: expected auto, none or a checkpoint path")
    return TrainConfig(
        model=ns.model,
        data=ns.data,
        fake_size=ns.fake_size,
        num_classes=ns.num_classes,
        image_size=ns.image_size,
        epochs=ns.epochs,
        steps=ns.steps,
        batch_size=ns.batch_size,
        accum=ns.accum,
        lr=ns.lr,
        momentum=ns.momentum,
        weight_decay=ns.weight_decay,
        warmup_steps=ns.warmup_steps,
        seed=ns.seed,
        amp=ns.amp,
        deterministic=ns.deterministic,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=ns.checkpoint_every,
        checkpoint_seconds=ns.checkpoint_seconds,
        keep=ns.keep,
        resume=ns.resume,
        timeout=ns.timeout,
        workers=ns.workers,
        log_every=ns.log_every,
        record_samples=Path(ns.record_samples) if ns.record_samples else None,
        stop_after=ns.stop_after,
    )
