"""Start-up sequence of a run once the flags are known, and the hand-off to the loop.

Order: data set (each rank on its own, before any collective, so a bad path ends every rank
at once), device and process group, resume state (read by rank 0 and broadcast, so only node 0
needs the file), model, optimizer, scheduler, DDP, data feed, loop. Any `UsageError` raised
here is reported by `orch_trainer.train.main` (exit 2).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from orch_trainer import dist
from orch_trainer.args import TrainConfig
from orch_trainer.checkpoint import load_state, resolve_resume
from orch_trainer.data import DataInfo, build_dataset, empty_batch, make_loader
from orch_trainer.errors import CheckpointError
from orch_trainer.loop import Feed, Loop, Parts, Policy, SampleRecorder
from orch_trainer.models import build_model
from orch_trainer.precision import resolve_precision
from orch_trainer.report import Reporter
from orch_trainer.sampler import ResumableBatchSampler, plan_total_steps
from orch_trainer.schedule import WarmupCosine, default_warmup, scaled_lr
from orch_trainer.signals import StopRequest
from orch_trainer.state import Progress, RunMeta, check_compatible, restore_state


def _configure_determinism(deterministic: bool) -> None:
    """Deterministic kernels where torch has them (a warning where it has not)."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first matmul
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _load_resume_state(
    cfg: TrainConfig, env: dist.DistEnv, environ: Mapping[str, str]
) -> tuple[Path | None, dict[str, Any] | None]:
    """Rank 0 finds and reads the checkpoint to resume; every rank gets it (or its error)."""
    payload: tuple[str | None, str | None, dict[str, Any] | None] = (None, None, None)
    if env.is_main:
        try:
            path = resolve_resume(cfg.resume, cfg.checkpoint_dir, environ)
            state = load_state(path) if path is not None else None
            payload = (None, str(path) if path is not None else None, state)
        except CheckpointError as exc:
            payload = (str(exc), None, None)
    error, path_text, state = dist.broadcast_from_main(payload)
    if error is not None:
        raise CheckpointError(error)
    return (Path(path_text) if path_text is not None else None), state


def _build_feed(cfg: TrainConfig, env: dist.DistEnv, info: DataInfo, device: torch.device) -> Feed:
    sampler = ResumableBatchSampler(
        info.num_samples,
        seed=cfg.seed,
        rank=env.rank,
        world_size=env.world_size,
        batch_size=cfg.batch_size,
        accum=cfg.accum,
    )
    loader = make_loader(
        info.dataset, sampler, workers=cfg.workers, pin_memory=device.type == "cuda"
    )
    return Feed(
        dataset=info.dataset,
        num_samples=info.num_samples,
        sampler=sampler,
        loader=loader,
        empty=empty_batch(info.dataset),
    )


def _build_parts(
    cfg: TrainConfig,
    env: dist.DistEnv,
    info: DataInfo,
    device: torch.device,
    *,
    total_steps: int,
) -> Parts:
    """Model, optimizer, scaler and scheduler of a fresh run (a resume loads into them)."""
    global_batch = cfg.batch_size * env.world_size * cfg.accum
    _seed_everything(cfg.seed)
    module = build_model(cfg.model, info.num_classes).to(device)
    peak_lr = scaled_lr(cfg.lr, global_batch)
    optimizer = torch.optim.SGD(
        module.parameters(), lr=peak_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    precision = resolve_precision(cfg.amp, device)
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else default_warmup(total_steps)
    return Parts(
        model=module,
        module=module,
        optimizer=optimizer,
        scaler=precision.make_scaler(),
        scheduler=WarmupCosine(
            optimizer, peak_lr=peak_lr, warmup_steps=warmup, total_steps=total_steps
        ),
        precision=precision,
        device=device,
        world_size=env.world_size,
    )


def _train(
    cfg: TrainConfig,
    env: dist.DistEnv,
    info: DataInfo,
    device: torch.device,
    stop: StopRequest,
    reporter: Reporter,
    environ: Mapping[str, str],
) -> tuple[int, int]:
    """Resume or start, train; return (exit status, steps done)."""
    resume_path, state = _load_resume_state(cfg, env, environ)
    meta = RunMeta(
        model=cfg.model,
        num_classes=info.num_classes,
        num_samples=info.num_samples,
        seed=cfg.seed,
        data=str(cfg.data),
        global_batch=cfg.batch_size * env.world_size * cfg.accum,
        world_size=env.world_size,
    )
    progress = Progress()
    if state is not None:
        check_compatible(state, meta)
        progress = Progress(**state["progress"])
    total_steps = plan_total_steps(
        step=progress.step,
        epoch=progress.epoch,
        epoch_samples=progress.epoch_samples,
        num_samples=info.num_samples,
        global_batch=meta.global_batch,
        epochs=cfg.epochs,
        steps=cfg.steps,
    )
    parts = _build_parts(cfg, env, info, device, total_steps=total_steps)
    if state is not None:
        restore_state(
            state,
            model=parts.module,
            optimizer=parts.optimizer,
            scaler=parts.scaler,
            scheduler=parts.scheduler,
            device=device,
        )
        reporter.event("resume", step=progress.step, path=str(resume_path))
        del state
    if dist.active():
        device_ids = [device.index] if device.type == "cuda" else None
        parts.model = DistributedDataParallel(parts.module, device_ids=device_ids)

    policy = Policy(
        total_steps=total_steps,
        log_every=cfg.log_every,
        checkpoint_dir=cfg.checkpoint_dir,
        checkpoint_every=cfg.checkpoint_every,
        checkpoint_seconds=cfg.checkpoint_seconds,
        keep=cfg.keep,
        stop_after=cfg.stop_after,
    )
    recorder = SampleRecorder(cfg.record_samples, env.rank)
    loop = Loop(
        parts=parts,
        feed=_build_feed(cfg, env, info, device),
        policy=policy,
        meta=meta,
        env=env,
        stop=stop,
        reporter=reporter,
        recorder=recorder,
    )
    try:
        return loop.run(progress), progress.step
    finally:
        recorder.close()


def run(cfg: TrainConfig, stop: StopRequest, environ: Mapping[str, str]) -> int:
    """Train as `cfg` says; return the exit status (0 done, 143 stopped).

    Raise `UsageError` for unreadable data or an unusable checkpoint.
    """
    env = dist.read_env(environ)
    reporter = Reporter(env)
    reporter.start()
    _configure_determinism(cfg.deterministic)
    info = build_dataset(
        cfg.data,
        fake_size=cfg.fake_size,
        num_classes=cfg.num_classes,
        image_size=cfg.image_size,
        seed=cfg.seed,
    )
    device = dist.select_device(env)
    dist.init_group(env, device, cfg.timeout)
    try:
        code, step = _train(cfg, env, info, device, stop, reporter, environ)
    finally:
        dist.shutdown()
    reporter.exit(code, step)
    return code
