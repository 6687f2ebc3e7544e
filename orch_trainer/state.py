"""What a checkpoint holds, and putting it back.

state.pt is a plain dict (loadable with `torch.load(..., weights_only=True)`):

    format       1
    meta         {model, num_classes, num_samples, seed, data, global_batch, world_size}
    progress     {epoch, epoch_samples, step}: the epoch being read, the samples of its
                 permutation consumed by all ranks together, optimizer steps done
    model        model.state_dict() (unwrapped from DDP)
    optimizer    optimizer.state_dict()
    scaler       GradScaler.state_dict() ({} when AMP fp16 is off)
    scheduler    WarmupCosine.state_dict()
    rng          {torch, cuda (or None), python, numpy} generator states of rank 0

A run may resume a checkpoint written with another world size or accumulation, but not one
of another model, class count, data set size or seed (`check_compatible`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer

from orch_trainer.errors import CheckpointError
from orch_trainer.schedule import WarmupCosine

FORMAT_VERSION = 1


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    epoch: int = 0  # epoch being read, 0-based
    epoch_samples: int = 0  # samples of this epoch's permutation consumed by all ranks
    step: int = 0  # optimizer steps done

    def advance(self, samples: int, num_samples: int) -> None:
        """Count one optimizer step that consumed `samples`; roll over at the epoch's end."""
        self.step += 1
        self.epoch_samples += samples
        if self.epoch_samples >= num_samples:
            self.epoch += 1
            self.epoch_samples = 0


@dataclass(frozen=True)
class RunMeta:
    """Facts about the run that wrote a checkpoint."""

    model: str
    num_classes: int
    num_samples: int
    seed: int
    data: str
    global_batch: int
    world_size: int


def capture_rng(device: torch.device) -> dict[str, Any]:
    """Generator states of this process (torch CPU, the current CUDA device, python, numpy)."""
    np_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python": random.getstate(),
        "numpy": {
            "key": [int(k) for k in np_state["state"]["key"]],
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
    }


def restore_rng(rng: dict[str, Any], device: torch.device) -> None:
    """Inverse of `capture_rng` (the CUDA state only when both sides have one)."""
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    saved = rng["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": np.asarray(saved["key"], dtype=np.uint32), "pos": saved["pos"]},
            "has_gauss": saved["has_gauss"],
            "gauss": saved["gauss"],
        }
    )


def collect_state(
    *,
    model: nn.Module,
    optimizer: Optimizer,
    scaler: torch.amp.GradScaler,
    scheduler: WarmupCosine,
    progress: Progress,
    meta: RunMeta,
    device: torch.device,
) -> dict[str, Any]:
    """The dict saved as state.pt; `model` must be the unwrapped module."""
    return {
        "format": FORMAT_VERSION,
        "meta": asdict(meta),
        "progress": asdict(progress),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": capture_rng(device),
    }


def check_compatible(state: dict[str, Any], meta: RunMeta) -> None:
    """Raise `CheckpointError` unless this run can continue the one that saved `state`."""
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint format {state.get('format')!r} is not {FORMAT_VERSION}")
    saved = state["meta"]
    for field in ("model", "num_classes", "num_samples", "seed"):
        if saved[field] != getattr(meta, field):
            raise CheckpointError(
                f"checkpoint was written with {field}={saved[field]!r}, "
                f"this run has {field}={getattr(meta, field)!r}"
            )


def restore_state(
    state: dict[str, Any],
    *,
    model: nn.Module,
    optimizer: Optimizer,
    scaler: torch.amp.GradScaler,
    scheduler: WarmupCosine,
    device: torch.device,
) -> Progress:
    """Load `state` into the (unwrapped) model, optimizer, scaler, scheduler and RNGs."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"] and scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    scheduler.load_state_dict(state["scheduler"])
    restore_rng(state["rng"], device)
    return Progress(**state["progress"])
