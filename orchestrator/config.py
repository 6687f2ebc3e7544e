"""orch's own settings: ORCH_HOME, then ORCH_HOME/config.yaml, then ORCH_* variables.

Layout of ORCH_HOME (default ~/.orch):

    orch.db                  the ledger (SQLite)
    config.yaml              optional settings, e.g. {local: {price_per_hour: 0.5}}
    keys/<cluster>/          per-cluster SSH key pair and known_hosts (dir 0700, keys 0600)
    jobs/<job id>/           pulled checkpoints, logs
    local/                   the local provider's nodes and network state
"""

from __future__ import annotations

import os
from decimal import Decimal
from ipaddress import IPv4Network
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ConfigError

LocalNetworkMode = Literal["auto", "namespace", "loopback"]


class LocalSettings(BaseModel):
    """Settings of the local provider."""

    model_config = ConfigDict(extra="forbid")

    price_per_hour: Decimal = Field(default=Decimal("0"), ge=0)  # USD per node-hour
    # auto: namespace hosts when running as root, else sshd on 127.0.0.1
    network: LocalNetworkMode = "auto"
    subnet: IPv4Network = IPv4Network("10.213.0.0/24")
    bridge: str = "orchbr0"


class ControllerSettings(BaseModel):
    """Timing of the controller's periodic work (seconds) and its idleness thresholds."""

    model_config = ConfigDict(extra="forbid")

    watch_interval: float = Field(default=5.0, gt=0)  # liveness, logs, GPU readings
    budget_interval: float = Field(default=10.0, gt=0)  # spend against the caps
    stop_allowance: float = Field(default=15.0, ge=0)  # how long a budget stop may take
    stop_grace: float = Field(default=60.0, ge=0)  # trainers' time to checkpoint on SIGTERM
    idle_util_pct: float = Field(default=5.0, ge=0, le=100)  # GPU busy threshold
    idle_cpu_pct: float = Field(default=10.0, ge=0)  # CPU fallback: % of one core, per node
    gpu_sample_every: float = Field(default=30.0, gt=0)  # ledger keeps one sample per window

    def runner_options(self) -> dict[str, float]:
        return {
            "watch_interval": self.watch_interval,
            "budget_interval": self.budget_interval,
            "stop_allowance": self.stop_allowance,
            "stop_grace": self.stop_grace,
            "idle_util_pct": self.idle_util_pct,
            "idle_cpu_pct": self.idle_cpu_pct,
            "gpu_sample_every": self.gpu_sample_every,
        }


class Settings(BaseModel):
    """Everything orch reads about its environment; built once per command and passed down."""

    model_config = ConfigDict(extra="forbid")

    home: Path
    local: LocalSettings = LocalSettings()
    controller: ControllerSettings = ControllerSettings()

    @property
    def db_path(self) -> Path:
        return self.home / "orch.db"

    def job_dir(self, job_id: str) -> Path:
        return self.home / "jobs" / job_id

    def keys_dir(self, cluster: str) -> Path:
        return self.home / "keys" / cluster


_ENV_OVERRIDES = {
    "ORCH_LOCAL_PRICE_PER_HOUR": ("local", "price_per_hour"),
    "ORCH_LOCAL_NETWORK": ("local", "network"),
    "ORCH_LOCAL_SUBNET": ("local", "subnet"),
    "ORCH_WATCH_INTERVAL": ("controller", "watch_interval"),
    "ORCH_BUDGET_INTERVAL": ("controller", "budget_interval"),
    "ORCH_STOP_ALLOWANCE": ("controller", "stop_allowance"),
    "ORCH_GPU_SAMPLE_EVERY": ("controller", "gpu_sample_every"),
}


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Read settings from ORCH_HOME/config.yaml and ORCH_* variables (variables win)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("ORCH_HOME") or Path.home() / ".orch").expanduser().absolute()
    raw: dict = {}
    config_file = home / "config.yaml"
    if config_file.exists():
        try:
            raw = yaml.safe_load(config_file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read {config_file}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{config_file} must hold a mapping of settings")
    for var, (section, key) in _ENV_OVERRIDES.items():
        if env.get(var):
            raw.setdefault(section, {})[key] = env[var]
    raw["home"] = home
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(
            f"invalid orch settings: {problems}",
            hint=f"fix {config_file} or the ORCH_* variables",
        ) from exc
