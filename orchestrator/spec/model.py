"""The job spec: what a user asks orch to run (models); `orchestrator.spec.loading` reads it.

A spec looks like this (every section but `name`, `workdir` and `run` is optional):

    name: cifar-ddp
    workdir: .                      # local directory, synced to every node
    data: [{src: ./data, dst: ~/data}, {src: s3://bucket/imagenet, dst: ~/imagenet}]
    outputs: [{src: ~/out, dst: s3://bucket/results}]   # uploaded when the job ends
    setup: pip install -r requirements.txt
    run: python -m orch_trainer.train --epochs 5
    resources: {gpus_per_node: 4, accelerator: A10G, nodes: 2, spot: true, max_price_per_hour: 3.0}
    checkpoint: {dir: ~/ckpt, pull_every: 60, store: s3://bucket/prefix, mirror: latest}
    budget: {max_cost_usd: 20, idle_timeout: 600, max_runtime: 4h}
    recovery: {max_recoveries: 5}
    progress: {pattern: 'Epoch (?P<step>[0-9]+)'}   # steps of a script that prints plain text
    env: {NCCL_DEBUG: WARN, RUN_NAME: "${USER}-cifar"}   # ${VAR}: from the submitting shell
    secrets: {WANDB_API_KEY: null}  # null: the submitting shell's $WANDB_API_KEY; never shown
    deadline: 36h                   # or an absolute time: 2025-07-01T18:00:00Z
    spot_policy: uniform-progress   # greedy, on-demand, spot-only, -mz: picks the zone too

Contract of `orchestrator.spec.loading.load_job(path, overrides)`:

- It reads at most `MAX_SPEC_BYTES` of YAML (safe constructors only: no Python tags), applies
  the command-line `overrides` (dotted keys such as `resources.nodes`) to the mapping, validates
  it with the pydantic models below, then checks that the local `workdir` is a directory and
  that every local `data[].src` exists (a bucket source is checked at submit, not here).
  Relative local paths resolve against the spec file's directory.
- Every failure is a `SpecError` (exit code 2) and nothing else: one message that lists each
  problem on its own line, naming the field by its dotted path (`resources.nodes`,
  `data[0].src`) and the YAML line it is on (or the line of its nearest existing parent), or the
  command-line flag it came from (`--nodes`). Unknown fields get a "did you mean" suggestion.
- `env` and `secrets` values are resolved against the submitting shell's environment
  (`load_job`'s `environ`) before validation: `${NAME}` and `$NAME` become NAME's value, `$$`
  a literal `$`, and a secret without a value takes the shell's variable of its own name; an
  unset variable is a SpecError naming it. `JobSpec.model_validate` itself expands nothing:
  the values it gets are final (a stored record validates to the same spec).
- On success it returns a `LoadedJob` holding the validated `JobSpec` and the resolved local
  paths. `JobSpec.model_dump(mode="json")` round-trips through `JobSpec.model_validate`.

Paths on a node (`data[].dst`, `checkpoint.dir`) are POSIX paths: `~` or `~/x` is under the
node's home, an absolute path is used as is, and a relative path is under the node's home
(`dst`) or the node's copy of the workdir (`checkpoint.dir`); see `DataMount.node_path` and
`CheckpointSpec.node_dir`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator.spec.container import ContainerSpec, RegistryLogin
from orchestrator.spec.mounts import BUCKET_RE, DataMount, OutputMount
from orchestrator.spec.placement import Image, InstanceTypes, Ports, Regions, Zones, zone_region
from orchestrator.spec.progress import ProgressSpec
from orchestrator.spec.values import (
    _DEADLINE_POLICIES,
    MAX_DURATION_S,
    Count,
    Deadline,
    EnvName,
    EnvValue,
    FieldError,
    Seconds,
    SecretValue,
    SpotPolicyName,
    Usd,
    _check_node_path_text,
    _check_path_text,
    _local_path,
    _node_path,
    _not_bool,
    _show,
    _spot_value,
    parse_duration,
)

__all__ = [
    "MAX_SPEC_BYTES",
    "OVERRIDE_FLAGS",
    "PROVIDER_NAMES",
    "Budget",
    "CheckpointSpec",
    "ContainerSpec",
    "DataMount",
    "Launcher",
    "MirrorMode",
    "OutputMount",
    "JobSpec",
    "ProgressSpec",
    "RegistryLogin",
    "LoadedJob",
    "Recovery",
    "Resources",
    "MAX_DURATION_S",
    "Seconds",
    "SpotPolicyName",
    "parse_duration",
]

PROVIDER_NAMES = ("local", "aws", "ssh")
"""The providers a spec may name; `orchestrator.providers.get_provider` builds each of them."""

MAX_SPEC_BYTES = 1024 * 1024
"""Largest job spec file accepted, in bytes (1 MiB)."""

MAX_NESTING = 32
"""Deepest nesting of mappings and lists accepted in a spec file."""

MAX_VALUES = 100_000
"""Most values (counting every use of a YAML alias) accepted in a spec file."""

OVERRIDE_FLAGS: dict[str, str] = {
    "resources.nodes": "--nodes",
    "resources.gpus_per_node": "--gpus",
    "resources.spot": "--spot",
    "budget.max_cost_usd": "--max-cost",
    "budget.idle_timeout": "--idle-timeout",
    "provider": "--provider",
}
"""Dotted spec key -> the `orch submit` flag that overrides it (used in error messages)."""

_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
_PROVIDER_RE = re.compile(r"[a-z][a-z0-9_-]*")
_MERGE_TAG = "tag:yaml.org,2002:merge"


# --------------------------------------------------------------------------------------------
# Models


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Resources(_Model):
    """What each node must have and how many nodes to run."""

    nodes: Count = Field(default=1, ge=1, le=64, description="number of nodes (1-64)")
    gpus_per_node: Count = Field(
        default=1,
        ge=1,
        le=16,
        description="GPUs per node (1-16); on the local provider, trainer processes per node",
    )
    accelerator: str | None = Field(
        default=None, description="GPU model wanted, e.g. A10G; None: any GPU that fits"
    )
    spot: Annotated[bool | Literal["auto"], BeforeValidator(_spot_value)] = Field(
        default=False,
        description='true: spot only; false: on-demand only; "auto": cheapest of both',
    )
    max_price_per_hour: Usd | None = Field(
        default=None, description="refuse offers above this USD price per node-hour"
    )
    min_gpu_memory_gb: Annotated[float, BeforeValidator(_not_bool)] | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="least memory per GPU, in GB"
    )
    disk_size_gb: Count | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="root volume per node, in GB (AWS: an encrypted gp3 volume);"
        " None: the image's own size",
    )
    instance_type: InstanceTypes | None = Field(
        default=None,
        description="AWS instance type, or a list in order of preference, e.g. [g5.12xlarge, "
        "g6.12xlarge]; None: the cheapest type that fits (local: ignored)",
    )
    region: Regions | None = Field(
        default=None, description="AWS region, or a list; None: aws.regions (local: ignored)"
    )
    zone: Zones | None = Field(
        default=None,
        description="availability zone, or a list, within the regions; None: any (local: ignored)",
    )
    image: Image | None = Field(
        default=None,
        description="AMI id, or an AMI name pattern (newest match); None: aws.ami_id or "
        "aws.ami_name (local: ignored)",
    )
    ports: Ports = Field(
        default_factory=list,
        description="ports or ranges (6006, 8000-8010) opened on the nodes to this machine's "
        "address only (local nodes are reachable from it anyway)",
    )

    @model_validator(mode="after")
    def _zones_in_regions(self) -> Resources:
        if self.zone and self.region:
            outside = [z for z in self.zone if zone_region(z) not in self.region]
            if outside:
                raise ValueError(
                    f"zone {', '.join(outside)} is not in region {', '.join(self.region)}: "
                    "list the zones' regions too, or leave region out"
                )
        return self

    @field_validator("accelerator")
    @classmethod
    def _accelerator_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty (leave it out to accept any GPU)")
        return value

    @property
    def total_gpus(self) -> int:
        """GPUs (local: trainer processes) over all nodes: the torchrun world size."""
        return self.nodes * self.gpus_per_node


_BUCKET_RE = BUCKET_RE
_STORE_HELP = "s3://bucket/prefix, or file:///absolute/path (a directory every node can reach)"

MirrorMode = Literal["all", "latest", "none"]
Launcher = Literal["torchrun", "none"]
"""What the user's machine keeps of a job's checkpoints (`checkpoint.mirror`)."""


def _store_url(value: str) -> str:
    if value.startswith("s3://"):
        bucket, _, prefix = value[5:].partition("/")
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
            raise ValueError(
                f"invalid S3 bucket name {_show(bucket)}: 3-63 lowercase letters, digits, "
                f"'.' and '-' (use {_STORE_HELP})"
            )
        if any(part in (".", "..") for part in prefix.split("/")) or "\x00" in prefix:
            raise ValueError(f"invalid key prefix {_show(prefix)}: no '.' or '..' parts")
        return "s3://" + bucket + ("/" + prefix.strip("/") if prefix.strip("/") else "")
    if value.startswith("file://"):
        path = value[7:]
        if not path.startswith("/") or any(p in (".", "..") for p in path.split("/")):
            raise ValueError(f"a file:// store needs an absolute path, like {_STORE_HELP}")
        return "file://" + (path.rstrip("/") or "/")
    raise ValueError(f"unknown store {_show(value)}: use {_STORE_HELP}")


class CheckpointSpec(_Model):
    """Where the run writes checkpoints on the nodes, where orch keeps them, and how often it
    looks for new ones."""

    dir: str | None = Field(
        default=None,
        description="path on the nodes; relative = under the workdir on the node; '~/' = node "
        "home; None: the job's own directory on the node (ORCH_CHECKPOINT_DIR points there)",
    )
    pull_every: Seconds = Field(
        default=60.0,
        description="seconds between looks for new checkpoints when no node reports one "
        "(new ones are fetched as soon as they are written)",
    )
    store: Annotated[str, AfterValidator(_store_url)] | None = Field(
        default=None,
        description="s3://bucket/prefix or file:///path: the nodes upload complete checkpoints "
        "there and new nodes download them from there",
    )
    mirror: MirrorMode | None = Field(
        default=None,
        description="what the user's machine keeps: all, latest or none (none needs a store); "
        "None: latest with a store, all without one",
    )

    @field_validator("dir")
    @classmethod
    def _dir_ok(cls, value: str | None) -> str | None:
        return None if value is None else _check_node_path_text(value)

    @model_validator(mode="after")
    def _mirror_needs_a_home(self) -> CheckpointSpec:
        if self.mirror == "none" and self.store is None:
            raise ValueError(
                "mirror: none keeps no copy anywhere without a store: set checkpoint.store "
                f"({_STORE_HELP}), or mirror: latest"
            )
        return self

    @property
    def mirror_mode(self) -> MirrorMode:
        """`mirror`, or its default: latest with a store, all without one."""
        if self.mirror is not None:
            return self.mirror
        return "latest" if self.store else "all"

    def node_dir(self, home: PurePosixPath, workdir: PurePosixPath) -> PurePosixPath | None:
        """The checkpoint directory on a node (None when unset), given its home and workdir."""
        return None if self.dir is None else _node_path(self.dir, home, workdir)


class Budget(_Model):
    """Limits that end the job: spend, hourly rate, idleness, wall time. None = no limit."""

    max_cost_usd: Usd | None = Field(default=None, description="stop when spend reaches this")
    max_hourly_usd: Usd | None = Field(
        default=None, description="refuse a cluster whose total hourly price is above this"
    )
    idle_timeout: Seconds | None = Field(
        default=None, description="stop after this many seconds of idle GPUs"
    )
    max_runtime: Seconds | None = Field(
        default=None, description="stop after this many seconds of running"
    )
    stall_timeout: Seconds | None = Field(
        default=None,
        description="stop as STALLED (exit 5) once rank 0's step has not advanced for this "
        "long (a run that never printed a step line: its output has not grown)",
    )


DEFAULT_START_TIMEOUT_S = 1200.0
"""`recovery.start_timeout` when a spec does not say (20 minutes): long enough for a large
checkpoint's load and a compiled first step, short of billing a hung rendezvous for hours."""


class Recovery(_Model):
    """How often a job is brought back after losing nodes (spot interruption, node loss)."""

    max_recoveries: Count = Field(default=3, ge=0, description="0 disables recovery")
    replace: Literal["lost", "all"] = Field(
        default="lost",
        description="lost: only the lost nodes are replaced, the others stay (the whole "
        "cluster moves when their zone has no capacity); all: every node is replaced",
    )
    start_timeout: Seconds | None = Field(
        default=DEFAULT_START_TIMEOUT_S,
        description="a (re)start whose rank 0 makes no progress this long after the setup is "
        "a failed start: restarted once on the same nodes, then the job fails; null: never",
    )


SECRET_HIDDEN = "(hidden)"
"""What `JobSpec.public_document` shows instead of a `secrets` value."""

_SECTIONS = (
    "container", "data", "resources", "checkpoint", "budget", "recovery", "env", "secrets",
    "progress", "outputs",
)  # fmt: skip


_ANY_HOME = PurePosixPath("/home")  # node paths are compared as they resolve under one home


def _first_repeat(paths: list[PurePosixPath]) -> tuple[int, int] | None:
    """(i, j), i < j, of the first path that repeats an earlier one; None when all differ."""
    first: dict[PurePosixPath, int] = {}
    for j, path in enumerate(paths):
        if path in first:
            return first[path], j
        first[path] = j
    return None


class JobSpec(_Model):
    """A validated job spec. Local paths in it are as written; see `LoadedJob` for resolved ones."""

    name: str = Field(description="job name: 1-63 of a-z, 0-9 and '-', starting with a letter")
    workdir: str = Field(
        description="local directory synced to every node; relative to the spec file's directory"
    )
    data: list[DataMount] = Field(
        default_factory=list,
        description="extra data copied to every node: local paths, or s3:// objects and prefixes",
    )
    outputs: list[OutputMount] = Field(
        default_factory=list,
        description="node paths uploaded to s3:// when the job ends, is cancelled, stopped or "
        "interrupted",
    )
    setup: str | None = Field(
        default=None, description="shell command run once on every node before `run`"
    )
    run: str = Field(
        description="training command: run under torchrun on every node, or once per node as "
        "written with `launcher: none`"
    )
    container: ContainerSpec | None = Field(
        default=None,
        description="the image `setup` and `run` run in on every node (none: on the bare node)",
    )
    launcher: Launcher = Field(
        default="torchrun",
        description="torchrun: orch starts `run` under torchrun, gpus_per_node processes a node; "
        "none: `run` runs once per node as written and starts its own processes (accelerate, "
        "deepspeed, a torchrun line of its own), with MASTER_ADDR, MASTER_PORT and NODE_RANK set",
    )
    resources: Resources = Field(default_factory=Resources, description="nodes and GPUs")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="checkpoint location and pulls"
    )
    budget: Budget = Field(default_factory=Budget, description="spend and time limits")
    recovery: Recovery = Field(default_factory=Recovery, description="spot/node-loss recovery")
    progress: ProgressSpec = Field(
        default_factory=ProgressSpec, description="how rank 0's steps are read from its output"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="extra environment variables for setup and run: settings, shown by status "
        "and dry runs; ${VAR} or $VAR is the submitting shell's VAR, $$ a literal $",
    )
    secrets: dict[EnvName, SecretValue] = Field(
        default_factory=dict,
        description="environment variables for setup and run whose values are never shown or "
        "kept in the ledger; null: the submitting shell's variable of the same name",
    )
    provider: str = Field(
        default="local", description="where nodes come from: local, aws, ssh (a fleet)"
    )
    fleet: str | None = Field(
        default=None,
        description="with provider: ssh, the fleet of your own machines the job runs on "
        "(`orch fleet add`); it waits in the fleet's queue while its GPUs are held",
    )
    deadline: Deadline | None = Field(
        default=None,
        description="finish by this UTC time, or this long after submit (a duration like 36h)",
    )
    spot_policy: SpotPolicyName | None = Field(
        default=None,
        description="who picks spot or on-demand as the job runs: uniform-progress, greedy "
        "(both need a deadline), on-demand, spot-only; with -mz (uniform-progress-mz, ...) it "
        "picks the zone too; None: resources.spot, fixed at launch",
    )

    @model_validator(mode="before")
    @classmethod
    def _empty_sections_are_defaults(cls, data: Any) -> Any:
        """`resources:` with nothing after it (YAML null) means the defaults."""
        if isinstance(data, dict) and any(data.get(k, 0) is None for k in _SECTIONS):
            return {k: v for k, v in data.items() if not (k in _SECTIONS and v is None)}
        return data

    @model_validator(mode="after")
    def _env_apart_from_secrets(self) -> JobSpec:
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(
                f"{', '.join(both)} is in both env and secrets: keep it in one "
                "(secrets: for a token, env: for a setting)"
            )
        return self

    @model_validator(mode="after")
    def _fleet_goes_with_ssh(self) -> JobSpec:
        if self.fleet is not None and not _NAME_RE.fullmatch(self.fleet):
            raise FieldError(("fleet",), f"invalid fleet name {_show(self.fleet)}: see `orch "
                             "fleet status` for the names")  # fmt: skip
        if self.provider == "ssh" and self.fleet is None:
            raise FieldError(
                ("fleet",),
                "provider ssh needs a fleet: add `fleet: NAME` (or --fleet NAME); "
                "`orch fleet status` lists the fleets",
            )
        if self.fleet is not None and self.provider != "ssh":
            raise FieldError(
                ("provider",),
                f"fleet {self.fleet} runs on provider ssh, not {self.provider}: set "
                "`provider: ssh` (or --provider ssh)",
            )
        return self

    @model_validator(mode="after")
    def _registry_password_is_a_secret(self) -> JobSpec:
        login = self.container.credentials if self.container else None
        if login is not None and login.password_secret not in self.secrets:
            raise FieldError(
                ("container", "credentials", "password_secret"),
                f"names {login.password_secret}, which is not in secrets: add "
                f"`secrets: {{{login.password_secret}: null}}` (the value then comes from your "
                "shell's variable of that name)",
            )
        return self

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                f"invalid name {_show(value)}: use 1-63 lowercase letters, digits and '-', "
                "starting with a letter (e.g. cifar-ddp)"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir_ok(cls, value: str) -> str:
        return _check_path_text(value)

    @field_validator("run")
    @classmethod
    def _run_ok(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty: give the training command")
        return value

    @field_validator("setup")
    @classmethod
    def _setup_ok(cls, value: str | None) -> str | None:
        return value if value is not None and value.strip() else None

    @field_validator("provider")
    @classmethod
    def _provider_ok(cls, value: str) -> str:
        if not _PROVIDER_RE.fullmatch(value) or value not in PROVIDER_NAMES:
            raise ValueError(
                f"unknown provider {_show(value)}: choose one of {', '.join(PROVIDER_NAMES)}"
            )
        return value

    @field_validator("spot_policy")
    @classmethod
    def _policy_has_deadline(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value in _DEADLINE_POLICIES and info.data.get("deadline") is None:
            if "deadline" not in info.data:
                return value  # the deadline itself is invalid and reported on its own
            raise ValueError(
                f"spot_policy {value} needs a deadline: add deadline: 36h (after submit) "
                "or deadline: 2025-07-01T18:00:00Z"
            )
        return value

    @field_validator("data")
    @classmethod
    def _distinct_destinations(cls, value: list[DataMount]) -> list[DataMount]:
        repeat = _first_repeat([mount.node_path(_ANY_HOME) for mount in value])
        if repeat is not None:
            i, j = repeat
            raise ValueError(f"data[{i}] and data[{j}] have the same dst {value[j].dst}")
        return value

    @field_validator("outputs")
    @classmethod
    def _distinct_output_sources(cls, value: list[OutputMount]) -> list[OutputMount]:
        repeat = _first_repeat([output.node_path(_ANY_HOME) for output in value])
        if repeat is not None:
            i, j = repeat
            raise ValueError(
                f"outputs[{i}] and outputs[{j}] have the same src {value[j].src}: "
                "upload it once (nodes: all for every node's copy)"
            )
        return value

    def deadline_at(self, submitted_at: datetime) -> datetime | None:
        """The deadline as a UTC time, for a job submitted at `submitted_at` (aware)."""
        if self.deadline is None:
            return None
        if isinstance(self.deadline, datetime):
            return self.deadline
        return submitted_at.astimezone(UTC) + timedelta(seconds=self.deadline)

    def public_document(self) -> dict[str, Any]:
        """The spec as JSON data for places other people or programs read (the ledger, the
        job record, dry-run output): each `secrets` value is replaced by `SECRET_HIDDEN`, the
        names stay; `env` values are settings and are shown. `model_dump` still holds the
        secrets' values."""
        document = self.model_dump(mode="json")
        document["secrets"] = dict.fromkeys(document["secrets"], SECRET_HIDDEN)
        return document

    def workdir_path(self, base_dir: Path) -> Path:
        """The absolute local workdir, given the spec file's directory (`~` expanded)."""
        return _local_path(self.workdir, base_dir)

    def data_source_paths(self, base_dir: Path) -> list[Path | None]:
        """The absolute local `src` of each `data` entry, in order; None for a bucket source
        (the nodes download it themselves)."""
        return [None if m.bucket_url else m.source_path(base_dir) for m in self.data]


@dataclass(frozen=True)
class LoadedJob:
    """A job spec read from a file, with its local paths resolved and checked."""

    spec: JobSpec  # the validated spec (overrides applied)
    source: Path  # absolute path of the YAML file
    base_dir: Path  # the YAML file's directory; relative local paths resolve against it
    workdir: Path  # absolute local workdir (exists and is a directory)
    # absolute local path of each spec.data[i].src (each exists); None for a bucket source
    data_sources: list[Path | None]
    # workdir files the sync leaves out (`orch submit --fresh`), relative to it
    left_out: tuple[str, ...] = ()
    # what reading the file changed of its meaning, for the user (a SkyPilot mount copied)
    notices: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
