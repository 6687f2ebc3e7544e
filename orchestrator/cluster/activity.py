"""Is the job using its hardware? GPU readings per node (or CPU use without GPUs), the idle
clock, and downsampled samples kept in the ledger for `orch status` and pictures.

One long-lived nvidia-smi per node streams readings over the node's existing connection; a
node where nvidia-smi is missing falls back to the CPU use of the job's processes, read once
per tick. Unknown readings never count as idle, so a broken nvidia-smi cannot stop a job.

The samples start with the run: the first tick waits a moment for every nvidia-smi's first
word (a reading, or that there is none), so it reads the GPUs, or takes the first CPU reading
that the next tick's rate starts from, at once. Each sample is stamped with the time of its
reading (a CPU rate with the start of the time it covers), not the tick that kept it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.gpu_watch import CpuWatcher, GpuWatcher
from orchestrator.ledger.store import GpuSampleRecord, utcnow
from orchestrator.node.gpu import Downsampler, GpuSample, IdlePolicy, NodeReading
from orchestrator.node.launch import NodeLayout

CPU_KEY = -1  # the "GPU index" under which a node's CPU fallback readings are stored
# For this long after the first reading, the ledger keeps one sample per watch interval
# rather than per `sample_every`: a job of a few minutes still has a curve to draw.
EARLY_SAMPLES_FOR_S = 300.0
# The first tick waits at most this long (and half a watch interval) for nvidia-smi's answer.
FIRST_ANSWER_WAIT_S = 3.0


@dataclass(frozen=True)
class ActivityThresholds:
    idle_util_pct: float = 5.0  # a GPU below this is idle
    idle_cpu_pct: float = 10.0  # without GPUs: the job's processes below this % of one core
    sample_every: float = 30.0  # the ledger keeps one averaged sample per window


class JobActivity:
    """Watches a job's nodes for activity. `start()`, then `tick()` once per watch interval,
    then `stop()` (which also writes the last samples)."""

    def __init__(
        self,
        job_id: str,
        cluster: Cluster,
        layout: NodeLayout,
        *,
        interval_s: float,
        gpus_per_node: int,
        idle_timeout_s: float | None,
        thresholds: ActivityThresholds,
        record: Callable[[list[GpuSampleRecord]], None],
    ) -> None:
        self.job_id = job_id
        self.record = record
        self.gpus_per_node = gpus_per_node
        self.gpus = [
            GpuWatcher(c, max(1, round(interval_s)), gpu_indices=instance.gpu_indices)
            for c, instance in zip(cluster.connections, cluster.instances, strict=True)
        ]
        self.cpus = [CpuWatcher.for_job(c, layout) for c in cluster.connections]
        # Without an idle timeout the clock still runs, for status; it just never stops a job.
        self.policy = IdlePolicy(
            timeout_s=idle_timeout_s or float(1 << 40),
            threshold_pct=thresholds.idle_util_pct,
            cpu_threshold_pct=thresholds.idle_cpu_pct,
        )
        self.downsampler = Downsampler(
            thresholds.sample_every,
            early_every_s=min(interval_s, thresholds.sample_every),
            early_for_s=EARLY_SAMPLES_FOR_S,
        )
        self.on_cpu = False  # some node has no GPUs: idleness is judged by CPU use there
        self.first_wait_s = min(FIRST_ANSWER_WAIT_S, interval_s / 2)
        self._ticked = False
        # time.monotonic() against the ledger's clock, to stamp a sample with its reading's time
        self._clock = (time.monotonic(), utcnow())

    def start(self) -> None:
        for watcher in self.gpus:
            watcher.start()

    def tick(self, now: float | None = None) -> float:
        """Take one reading of every node; returns for how long the job has been idle (s).
        `now` is on `time.monotonic()`'s clock (default: now, after the first tick's wait)."""
        if not self._ticked:
            self._ticked = True
            deadline = time.monotonic() + self.first_wait_s
            for gpu in self.gpus:
                gpu.wait_answer(deadline - time.monotonic())
        now = time.monotonic() if now is None else now
        readings: list[NodeReading] = []
        finished = []
        # When the readings were taken: the newest GPU record, not this tick. The idle clock
        # then starts when the GPUs went idle, not up to one tick later.
        observed_at: float | None = None
        for rank, (gpu, cpu) in enumerate(zip(self.gpus, self.cpus, strict=True)):
            state = gpu.latest(now)
            if state.updated_at is not None and state.available is not False:
                observed_at = max(observed_at or state.updated_at, state.updated_at)
            if state.available is False:
                self.on_cpu = True
                observed_at = now  # a CPU reading is taken now
                percent = cpu.sample(now)
                readings.append(percent)
                if percent is None and cpu.error is None:
                    continue  # the first reading: a rate needs two, nothing went wrong
                sample = GpuSample(CPU_KEY, None, percent, None, None, percent is not None)
                began = cpu.since if percent is not None and cpu.since is not None else now
                finished += self._downsample((rank, CPU_KEY), began, sample)
                continue
            readings.append(state)
            if state.available is None and not state.samples and state.error is None:
                # nvidia-smi has not answered yet: the node may well have no GPU at all, and
                # recording its GPUs as unknown would draw GPUs that never existed.
                continue
            # No reading at all (nvidia-smi failing, hanging, printing garbage): every GPU the
            # node should have is recorded as unknown, so status says so.
            own = gpu.gpu_indices
            samples = state.samples or [
                GpuSample.unknown(index)
                for index in (range(self.gpus_per_node) if own is None else own)
            ]
            # A fresh record is placed at its own time; anything unknown at this tick's.
            fresh = state.updated_at is not None and all(sample.ok for sample in samples)
            read_at = state.updated_at if fresh and state.updated_at is not None else now
            for sample in samples:
                finished += self._downsample((rank, sample.index or 0), min(read_at, now), sample)
        self.policy.update(min(now, observed_at if observed_at is not None else now), readings)
        if finished:
            self.record(finished)
        return self.policy.idle_for(now)

    @property
    def what(self) -> str:
        return "the job's processes (no GPU)" if self.on_cpu else "every GPU"

    def _downsample(
        self, key: tuple[int, int], now: float, sample: GpuSample
    ) -> list[GpuSampleRecord]:
        window = self.downsampler.add(key, now, sample)
        return [] if window is None else [self._record(key, window.sample, window.first)]

    def _record(self, key: tuple[int, int], sample: GpuSample, read_at: float) -> GpuSampleRecord:
        rank, gpu = key
        mono, wall = self._clock
        return GpuSampleRecord(
            job_id=self.job_id,
            rank=rank,
            gpu=gpu,
            at=wall + timedelta(seconds=read_at - mono),  # when its first reading was taken
            util_pct=sample.util_pct,
            mem_used_mib=sample.mem_used_mib,
            mem_total_mib=sample.mem_total_mib,
            ok=sample.ok,
        )

    def stop(self) -> None:
        for watcher in self.gpus:
            watcher.stop()
        pending = [
            self._record(window.key, window.sample, window.first)  # type: ignore[arg-type]
            for window in self.downsampler.flush()
        ]
        if pending:
            self.record(pending)
