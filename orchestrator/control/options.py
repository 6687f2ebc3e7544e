"""What every part of the runner shares: its timing knobs and where it tells a human."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from orchestrator.node.progress import Metrics


class Reporter(Protocol):
    """Where the runner tells a human what happens. Implementations must not raise."""

    def phase(self, text: str) -> None: ...

    def metrics(self, metrics: Metrics) -> None: ...

    def line(self, text: str) -> None: ...


class SilentReporter:
    def phase(self, text: str) -> None:
        pass

    def metrics(self, metrics: Metrics) -> None:
        pass

    def line(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class RunnerOptions:
    """Timing knobs of the runner (seconds)."""

    watch_interval: float = 5.0  # how often nodes are probed (liveness, logs, GPUs)
    budget_interval: float = 10.0  # how often spend is checked against the caps
    stop_allowance: float = 15.0  # seconds a budget stop may take (SIGTERM, pull, terminate)
    lost_after: int = 3  # consecutive failed probes before a node counts as lost
    probe_timeout: float = 5.0  # a node unanswered this long (or a watch interval) missed a check
    stop_grace: float = 60.0  # how long trainers get to checkpoint after SIGTERM
    connect_timeout: float = 10.0
    idle_util_pct: float = 5.0  # GPU utilization below which a GPU is idle
    idle_cpu_pct: float = 10.0  # without GPUs: job CPU (% of one core) below which it is idle
    gpu_sample_every: float = 30.0  # the ledger keeps one averaged GPU sample per window
    notice_poll_interval: float = 5.0  # how often each node polls for a spot notice
    deadman_timeout: float = 600.0  # a node unheard from this long, not training, ends itself
    final_pull_wait: float = 60.0  # at a run's end, how long the nodes' agents may take to stage
    store_only_wait: float = 900.0  # the same with `mirror: none`: the store has the only copy
    launch_retries: int = 5  # refused spot-only launches retried before the job fails
    launch_backoff: float = 10.0  # first wait before such a retry; doubles each time
    policy_interval: float = 5.0  # spot policy (spec.spot_policy): seconds between decisions
    restart_overhead_prior: float = 720.0  # spot policy: a restart's cost until one is measured
    push_timeout: float = 3600.0  # one push of the workdir, data or checkpoints, at most
