"""Learning rate: linear scaling with the global batch, linear warmup, cosine decay to zero.

The rate used by optimizer step s (0-based: s steps were done before it) is

    peak = base_lr * global_batch / 256
    lr(s) = peak * (s + 1) / warmup                          for s < warmup
    lr(s) = peak * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2   otherwise

so the first step already trains, the peak is reached on the last warmup step, and the rate
reaches zero only after the last step. `WarmupCosine` applies it to an optimizer and stores
its position in checkpoints.
"""

from __future__ import annotations

import math
from typing import Any

from torch.optim import Optimizer

REFERENCE_BATCH = 256


def scaled_lr(base_lr: float, global_batch: int, reference: int = REFERENCE_BATCH) -> float:
    """The linear scaling rule: `base_lr` is the rate for a global batch of `reference`."""
    return base_lr * global_batch / reference


def default_warmup(total_steps: int) -> int:
    """5% of the run, the usual share for a large-batch warmup."""
    return total_steps // 20


def lr_factor(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the peak rate for optimizer step `step` (0-based), in [0, 1]."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """Sets every param group's lr to `peak_lr * lr_factor(step)` before each optimizer step.

    Call `step()` after each `optimizer.step()`. The state is the number of steps done;
    `peak_lr`, warmup and total come from the current run (a resumed run on another world
    size keeps its position but uses its own peak).
    """

    def __init__(
        self, optimizer: Optimizer, *, peak_lr: float, warmup_steps: int, total_steps: int
    ) -> None:
        self.optimizer = optimizer
        self.peak_lr = peak_lr
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.steps_done = 0
        self._apply()

    @property
    def lr(self) -> float:
        """The rate the next optimizer step will use."""
        factor = lr_factor(
            self.steps_done, warmup_steps=self.warmup_steps, total_steps=self.total_steps
        )
        return self.peak_lr * factor

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def step(self) -> None:
        self.steps_done += 1
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps_done": self.steps_done,
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state["steps_done"])
        self._apply()
