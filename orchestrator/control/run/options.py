"""What every part of the runner shares: its timing knobs and where it tells a human."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

from orchestrator.config import ControllerSettings
from orchestrator.node.progress import Metrics


def _is_setting(name: str) -> bool:
    return name in ControllerSettings.model_fields


def _setting(name: str) -> Any:
    """The default of the setting `controller.<name>`, the runner's default too."""
    return ControllerSettings.model_fields[name].default


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
    """Timing knobs of the runner (seconds). Those that are settings (`controller.*`) default
    to the setting's default; `from_settings` takes them from the settings in effect."""

    # how often nodes are probed (liveness, logs, GPUs)
    watch_interval: float = _setting("watch_interval")
    # how often spend is checked against the caps
    budget_interval: float = _setting("budget_interval")
    # seconds a budget stop may take (SIGTERM, pull, terminate)
    stop_allowance: float = _setting("stop_allowance")
    lost_after: int = 3  # consecutive failed probes before a node counts as lost
    probe_timeout: float = 5.0  # a node unanswered this long (or a watch interval) missed a check
    stop_grace: float = _setting("stop_grace")  # how long trainers get to checkpoint after SIGTERM
    connect_timeout: float = 10.0
    idle_util_pct: float = _setting("idle_util_pct")  # GPU utilization below which a GPU is idle
    # without GPUs: job CPU (% of one core) below which it is idle
    idle_cpu_pct: float = _setting("idle_cpu_pct")
    # the ledger keeps one averaged GPU sample per window
    gpu_sample_every: float = _setting("gpu_sample_every")
    # how often each node polls for a spot notice
    notice_poll_interval: float = _setting("notice_poll_interval")
    # a node unheard from this long, not training, ends itself
    deadman_timeout: float = _setting("deadman_timeout")
    final_pull_wait: float = 60.0  # at a run's end, how long the nodes' agents may take to stage
    store_only_wait: float = 900.0  # the same with `mirror: none`: the store has the only copy
    # refused spot-only launches retried before the job fails
    launch_retries: int = _setting("launch_retries")
    # first wait before such a retry; doubles each time
    launch_backoff: float = _setting("launch_backoff")
    # spot policy (spec.spot_policy): seconds between decisions
    policy_interval: float = _setting("policy_interval")
    # spot policy: a restart's cost until one is measured
    restart_overhead_prior: float = _setting("restart_overhead_prior")
    # one push of the workdir, data or checkpoints, at most
    push_timeout: float = _setting("push_timeout")

    @classmethod
    def from_settings(cls, controller: ControllerSettings) -> RunnerOptions:
        """The options the settings in effect give (every knob that is a setting)."""
        return cls(
            **{f.name: getattr(controller, f.name) for f in fields(cls) if _is_setting(f.name)}
        )
