"""Which sample indices each rank reads, resumable at any step and any world size.

Each epoch has one permutation of all sample indices, a function of (seed, epoch) only. The
position in the epoch is the number of samples of that permutation already consumed (a global
count, independent of the world size). From the position on, the rest of the permutation is
cut into optimizer steps of `global_batch = batch_size * world_size * accum` samples (the last
step of the epoch may be shorter), each step into micro-steps of `batch_size * world_size`, and
each micro-step is dealt to the ranks round-robin (`chunk[rank::world_size]`).

Consequences the trainer relies on:
- After k steps the ranks together consumed exactly `order[start : start + k * global_batch]`
  (clipped to the epoch), whatever the world size. A checkpoint stores that position, so a
  run resumed on a different number of ranks neither repeats nor skips a sample.
- Every rank sees the same number of steps and micro-steps (needed for DDP), but near the end
  of an epoch a rank may get fewer samples, even none, in a micro-step.
- `StepPlan.global_samples` is the same on every rank, so the loss can be normalized by the
  true global batch of the step without communication.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from torch.utils.data import Sampler


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step as seen by one rank."""

    micro_batches: tuple[tuple[int, ...], ...]  # indices this rank reads, per micro-step
    global_samples: int  # samples all ranks together consume in this step (> 0)

    @property
    def indices(self) -> list[int]:
        """All indices this rank reads in the step, in order."""
        return [i for micro in self.micro_batches for i in micro]


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The order in which epoch `epoch` visits the samples; same on every rank and run."""
    rng = np.random.default_rng([seed, epoch])
    return [int(i) for i in rng.permutation(num_samples)]


def steps_remaining(num_samples: int, start: int, global_batch: int) -> int:
    """Optimizer steps left in an epoch of `num_samples` when `start` samples are consumed."""
    return math.ceil(max(num_samples - start, 0) / global_batch)


def plan_steps(
    order: Sequence[int],
    *,
    start: int,
    rank: int,
    world_size: int,
    batch_size: int,
    accum: int,
) -> Iterator[StepPlan]:
    """Steps of the rest of the epoch (from position `start` of `order`) for `rank`."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    if not 0 <= start <= len(order):
        raise ValueError(f"position {start} outside epoch of {len(order)} samples")
    micro = batch_size * world_size
    global_batch = micro * accum
    position = start
    while position < len(order):
        step_end = min(position + global_batch, len(order))
        micro_batches = tuple(
            tuple(order[m : min(m + micro, step_end)][rank::world_size])
            for m in range(position, step_end, micro)
        )
        yield StepPlan(micro_batches, step_end - position)
        position = step_end


class ResumableBatchSampler(Sampler[list[int]]):
    """Batch sampler of one rank: yields its micro-batches (lists of indices, maybe empty).

    `set_epoch(epoch, start)` selects the epoch and the global position to start from; call it
    before each epoch and before iterating the DataLoader. `steps()` gives the same micro-batches
    grouped by optimizer step, for the training loop.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int,
        rank: int,
        world_size: int,
        batch_size: int,
        accum: int,
    ) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self.accum = accum
        self.epoch = 0
        self.start = 0
        self._order = epoch_permutation(num_samples, seed, 0)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.accum

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"position {start} outside epoch of {self.num_samples} samples")
        if epoch != self.epoch:
            self._order = epoch_permutation(self.num_samples, self.seed, epoch)
        self.epoch = epoch
        self.start = start

    def steps(self) -> Iterator[StepPlan]:
        return plan_steps(
            self._order,
            start=self.start,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=self.batch_size,
            accum=self.accum,
        )

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.steps():
            for micro in step.micro_batches:
                yield list(micro)

    def __len__(self) -> int:
        micro = self.batch_size * self.world_size
        return math.ceil((self.num_samples - self.start) / micro)


def plan_total_steps(
    *,
    step: int,
    epoch: int,
    epoch_samples: int,
    num_samples: int,
    global_batch: int,
    epochs: int | None,
    steps: int | None,
) -> int:
    """Optimizer step count at which the run ends, counted from the very first step.

    `steps` alone: exactly that. `epochs` (default 1): the end of that epoch, reached from the
    current position with the current global batch. Both: whichever comes first.
    """
    if steps is not None and epochs is None:
        return steps
    target_epochs = epochs if epochs is not None else 1
    remaining = 0
    if epoch < target_epochs:
        per_epoch = steps_remaining(num_samples, 0, global_batch)
        remaining = steps_remaining(num_samples, epoch_samples, global_batch)
        remaining += (target_epochs - epoch - 1) * per_epoch
    total = step + remaining
    return min(total, steps) if steps is not None else total
