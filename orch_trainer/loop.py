"""The training loop: steps, agreement between ranks, logging, checkpoints, stopping.

One optimizer step (`run_step`) reads the micro-batches its `StepPlan` names. The loss of a
micro-step is `sum of per-sample losses * world_size / global_samples`; DDP averages gradients
over ranks, so the update is the gradient of the mean loss over the step's global batch
however the batch was split across ranks and micro-steps (this is what makes 2 ranks x 8
equal 1 rank x 16, and 8 x accum 2 equal 16). Gradients are synchronized only on the last
micro-step (`no_sync` before it).

After each step the ranks sum one small tensor: [stop wanted, time-based save due, loss sum].
So all ranks stop after the same step, and rank 0's clock alone decides time-based
saves. Only rank 0 writes checkpoints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Dataset

from orch_trainer import dist
from orch_trainer.checkpoint import save_checkpoint
from orch_trainer.data import Batch, set_data_epoch
from orch_trainer.precision import Precision
from orch_trainer.report import Reporter
from orch_trainer.sampler import ResumableBatchSampler, StepPlan
from orch_trainer.schedule import WarmupCosine
from orch_trainer.signals import EXIT_STOPPED, StopRequest
from orch_trainer.state import Progress, RunMeta, collect_state

EXIT_OK = 0


@dataclass
class Parts:
    """The objects one rank trains with."""

    model: nn.Module  # what forward/backward run through (DDP-wrapped when distributed)
    module: nn.Module  # the bare model, saved in checkpoints
    optimizer: Optimizer
    scaler: torch.amp.GradScaler
    scheduler: WarmupCosine
    precision: Precision
    device: torch.device
    world_size: int


@dataclass
class Feed:
    """Where the samples come from."""

    dataset: Dataset[Any]
    num_samples: int
    sampler: ResumableBatchSampler
    loader: DataLoader[Any]
    empty: Batch  # stands in for a micro-batch with no samples on this rank


@dataclass(frozen=True)
class Policy:
    """When to log, save and stop."""

    total_steps: int  # the run ends after this many optimizer steps
    log_every: int
    checkpoint_dir: Path | None  # None: never save
    checkpoint_every: int  # 0: off
    checkpoint_seconds: float  # 0: off
    keep: int
    stop_after: int | None  # debug: stop as if signalled after this step


@dataclass
class _Window:
    """Loss and throughput since the last progress line."""

    started: float = field(default_factory=time.monotonic)
    loss_sum: float = 0.0
    samples: float = 0.0

    def add(self, loss_sum: float, samples: float) -> None:
        self.loss_sum += loss_sum
        self.samples += samples

    def reset(self) -> None:
        self.started, self.loss_sum, self.samples = time.monotonic(), 0.0, 0.0


class SampleRecorder:
    """Debug aid: appends `{"epoch","step","indices"}` per step to this rank's own file."""

    def __init__(self, prefix: Path | None, rank: int) -> None:
        self._file: TextIO | None = None
        if prefix is not None:
            path = prefix.with_name(f"{prefix.name}.rank{rank}.jsonl")
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def record(self, epoch: int, step: int, plan: StepPlan) -> None:
        if self._file is not None:
            line = {"epoch": epoch, "step": step, "indices": plan.indices}
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def run_step(parts: Parts, plan: StepPlan, batches: Iterator[Batch | None], empty: Batch) -> float:
    """Forward/backward every micro-batch of `plan`, then one optimizer step.

    Return this rank's sum of per-sample losses (not normalized).
    """
    scale = parts.world_size / plan.global_samples
    last = len(plan.micro_batches) - 1
    is_ddp = isinstance(parts.model, DistributedDataParallel)
    loss_sum = torch.zeros((), device=parts.device)
    for i in range(len(plan.micro_batches)):
        batch = next(batches)
        images, labels = empty if batch is None else batch
        images = images.to(parts.device, non_blocking=True)
        labels = labels.to(parts.device, non_blocking=True)
        syncing = i == last or not is_ddp
        with nullcontext() if syncing else parts.model.no_sync():  # type: ignore[operator]
            with parts.precision.autocast():
                logits = parts.model(images)
            loss = F.cross_entropy(logits.float(), labels, reduction="sum")
            parts.scaler.scale(loss * scale).backward()
        loss_sum += loss.detach()
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    return float(loss_sum.item())


class Loop:
    """Runs the steps from `progress` to `policy.total_steps`; see the module docstring."""

    def __init__(
        self,
        *,
        parts: Parts,
        feed: Feed,
        policy: Policy,
        meta: RunMeta,
        env: dist.DistEnv,
        stop: StopRequest,
        reporter: Reporter,
        recorder: SampleRecorder,
    ) -> None:
        self.parts = parts
        self.feed = feed
        self.policy = policy
        self.meta = meta
        self.env = env
        self.stop = stop
        self.reporter = reporter
        self.recorder = recorder
        self.saved_step: int | None = None
        self.last_save = time.monotonic()

    def save(self, progress: Progress) -> None:
        """Rank 0 writes a checkpoint of `progress` (no collective; others go on)."""
        directory = self.policy.checkpoint_dir
        self.last_save = time.monotonic()
        self.saved_step = progress.step
        if directory is None or not self.env.is_main:
            return
        state = collect_state(
            model=self.parts.module,
            optimizer=self.parts.optimizer,
            scaler=self.parts.scaler,
            scheduler=self.parts.scheduler,
            progress=progress,
            meta=self.meta,
            device=self.parts.device,
        )
        path = save_checkpoint(directory, progress.step, state, keep=self.policy.keep)
        self.reporter.event("checkpoint", step=progress.step, path=str(path.resolve()))

    def _save_due_here(self) -> bool:
        seconds = self.policy.checkpoint_seconds
        return self.env.is_main and seconds > 0 and time.monotonic() - self.last_save >= seconds

    def run(self, progress: Progress) -> int:
        """Train; return EXIT_OK after the last step or EXIT_STOPPED after a stop request."""
        policy, feed = self.policy, self.feed
        window = _Window()
        while progress.step < policy.total_steps:
            epoch = progress.epoch
            feed.sampler.set_epoch(epoch, progress.epoch_samples)
            set_data_epoch(feed.dataset, epoch)
            batches: Iterator[Batch | None] = iter(feed.loader)
            for plan in feed.sampler.steps():
                lr = self.parts.scheduler.lr
                loss_sum = run_step(self.parts, plan, batches, feed.empty)
                self.parts.scheduler.step()
                progress.advance(plan.global_samples, feed.num_samples)
                self.recorder.record(epoch, progress.step, plan)
                wants_stop = self.stop.requested or progress.step == policy.stop_after
                stop_votes, save_votes, loss_total = dist.sum_across(
                    [float(wants_stop), float(self._save_due_here()), loss_sum],
                    self.parts.device,
                )
                window.add(loss_total, plan.global_samples)
                finished = progress.step >= policy.total_steps
                if progress.step % policy.log_every == 0 or finished:
                    elapsed = max(time.monotonic() - window.started, 1e-9)
                    self.reporter.progress(
                        step=progress.step,
                        epoch=epoch,
                        loss=window.loss_sum / window.samples,
                        lr=lr,
                        img_s=window.samples / elapsed,
                        total_steps=policy.total_steps,
                    )
                    window.reset()
                if stop_votes > 0 and not finished:
                    return self._stop(progress)
                every = policy.checkpoint_every
                if save_votes > 0 or (every and progress.step % every == 0):
                    self.save(progress)
                if finished:
                    break
            del batches
        if self.saved_step != progress.step:
            self.save(progress)
        dist.barrier(self.parts.device)
        self.reporter.event("done", step=progress.step)
        return EXIT_OK

    def _stop(self, progress: Progress) -> int:
        self.save(progress)
        reason = self.stop.signal_name or (
            "stop-after" if progress.step == self.policy.stop_after else "peer"
        )
        self.reporter.event("stopped", step=progress.step, signal=reason)
        dist.barrier(self.parts.device)
        return EXIT_STOPPED
