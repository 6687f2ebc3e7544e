"""orch's own settings: ORCH_HOME, then ORCH_HOME/config.yaml, then ORCH_* variables.

Layout of ORCH_HOME (default ~/.orch):

    orch.db                  the ledger (SQLite) unless `ledger.url` names a database;
                             orch.db.schema-lock: held while it is migrated
    config.yaml              optional settings, e.g. {local: {price_per_hour: 0.5}},
                             {aws: {regions: [us-east-1], ami_id: ami-...}},
                             {budget: {monthly_usd: 500}}
    keys/<cluster>/          per-cluster SSH key pair and known_hosts (dir 0700, keys 0600)
    jobs/<job id>/           pulled checkpoints, logs (capped and rotated: `logs` settings)
    local/                   the local provider's nodes and network state (`local.root`)
    machine-id               this ORCH_HOME's id as a machine of a shared ledger
"""

from __future__ import annotations

import os
import re
from decimal import Decimal
from ipaddress import IPv4Network, ip_network
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.errors import ConfigError
from orchestrator.spec.values import Seconds

LocalNetworkMode = Literal["auto", "namespace", "loopback"]


class Env:
    """Marks a setting with the ORCH_* variable that sets it (`Annotated[float, Env("ORCH_X")]`):
    the one place where a setting's variable is named. A set, non-empty variable wins over
    config.yaml (`load_settings`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Env({self.name!r})"


class LocalSettings(BaseModel):
    """Settings of the local provider."""

    model_config = ConfigDict(extra="forbid")

    # USD per on-demand node-hour
    price_per_hour: Annotated[Decimal, Env("ORCH_LOCAL_PRICE_PER_HOUR")] = Field(
        default=Decimal("0"), ge=0
    )
    # USD per spot node-hour; None: a third of price_per_hour (spot's usual discount)
    spot_price_per_hour: Annotated[Decimal | None, Env("ORCH_LOCAL_SPOT_PRICE_PER_HOUR")] = Field(
        default=None, ge=0
    )
    # auto: namespace hosts when running as root, else sshd on 127.0.0.1
    network: Annotated[LocalNetworkMode, Env("ORCH_LOCAL_NETWORK")] = "auto"
    subnet: Annotated[IPv4Network, Env("ORCH_LOCAL_SUBNET")] = IPv4Network("10.213.0.0/24")
    # the host bridge of namespace nodes (a name of at most 15 characters); each bridge holds
    # its own subnet, so two sets of nodes on two bridges never share one
    bridge: Annotated[str, Env("ORCH_LOCAL_BRIDGE")] = "orchbr0"
    # where the nodes' records, disks and network state live; None: ORCH_HOME/local. Several
    # ORCH_HOMEs naming one root share one local "cloud", as machines share an AWS account
    root: Annotated[Path | None, Env("ORCH_LOCAL_ROOT")] = None
    # the venv whose bin/ is first on local nodes' PATH (torchrun, python); None: the
    # controller's own. A loopback controller host gets the laptop's, so that the nodes it
    # launches keep their software when the host is gone, as a cloud node keeps its image's
    node_venv: Annotated[Path | None, Env("ORCH_LOCAL_NODE_VENV")] = None
    # registries (HOST:PORT) the nodes' podman may reach over plain HTTP: one of your own
    # network without TLS; every other registry needs HTTPS. The hosts of `orch sandbox aws`
    # (and of any cloud on this machine) take it too.
    insecure_registries: Annotated[list[str], Env("ORCH_LOCAL_INSECURE_REGISTRIES")] = Field(
        default_factory=list
    )

    @field_validator("bridge")
    @classmethod
    def _bridge_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,14}", value):
            raise ValueError(
                f"bridge {value!r} is not an interface name: 1-15 letters, digits, '_' or '-', "
                "starting with a letter"
            )
        return value

    @field_validator("insecure_registries", mode="before")
    @classmethod
    def _split_registries(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def spot_price(self) -> Decimal:
        """USD per spot node-hour in effect (see `spot_price_per_hour`)."""
        if self.spot_price_per_hour is not None:
            return self.spot_price_per_hour
        return (self.price_per_hour / 3).quantize(Decimal("0.000001"))


class AwsSettings(BaseModel):
    """Settings of the AWS provider. Nothing here is read from AWS at load time.

    Network ids (key pair, security group, subnets) come from, in order: these fields, the
    Terraform outputs file `tf_outputs` (`terraform output -json`: `key_name`,
    `security_group_id`, `subnet_ids` = {zone: subnet id}, optional `region`), or else the
    provider creates a key pair and an `orch` security group in the region's default VPC.
    """

    model_config = ConfigDict(extra="forbid")

    regions: Annotated[list[str], Env("ORCH_AWS_REGIONS")] = Field(
        default_factory=lambda: ["us-east-1", "us-east-2", "us-west-2"], min_length=1
    )
    # EC2 endpoint override (tests: the moto server)
    endpoint_url: Annotated[str | None, Env("ORCH_AWS_ENDPOINT_URL")] = None
    ami_id: Annotated[str | None, Env("ORCH_AWS_AMI_ID")] = None  # used as is when set
    ami_name: str = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *"
    ami_owners: list[str] = Field(default_factory=lambda: ["amazon"])  # [] = any owner
    ssh_user: str = "ubuntu"
    interface: str = "ens5"  # NIC carrying the private IP on the node (GLOO/NCCL_SOCKET_IFNAME)
    owner: str | None = None  # value of the orch-owner tag; None: the login name
    key_name: str | None = None
    security_group_id: str | None = None
    subnet_ids: dict[str, str] = Field(default_factory=dict)  # zone -> subnet id
    # `terraform output -json` file of infra/
    tf_outputs: Annotated[Path | None, Env("ORCH_AWS_TF_OUTPUTS")] = None
    # instance profile the nodes of a job with a checkpoint store get (its role may write the
    # store's prefix); None: Terraform's `instance_profile` output
    instance_profile: Annotated[str | None, Env("ORCH_AWS_INSTANCE_PROFILE")] = None
    # ARN of infra/'s per-job node policy (its `node_job_policy` output): with it, the nodes of
    # a job with a store get a role of their own that reaches only the job's store prefix;
    # None: the Terraform outputs' `node_job_policy`, else all nodes share `instance_profile`
    node_job_policy: Annotated[str | None, Env("ORCH_AWS_NODE_JOB_POLICY")] = None
    # instance profile of the controller host (`orch controller up --provider aws`): its role
    # may launch, tag and end only orch-owner instances (infra/'s `controller_instance_profile`)
    controller_instance_profile: Annotated[
        str | None, Env("ORCH_AWS_CONTROLLER_INSTANCE_PROFILE")
    ] = None
    # the EC2 endpoint as the controller host reaches it, when it is not `endpoint_url` (a cloud
    # on this machine: the sandbox's address on its hosts' bridge); None: `endpoint_url`
    controller_endpoint_url: Annotated[str | None, Env("ORCH_AWS_CONTROLLER_ENDPOINT_URL")] = None
    # who may reach port 22 of the `orch` security group (your own rule, beside other owners'):
    # an address or a CIDR block, e.g. your public address/32; None: for a cloud on this machine
    # (a loopback endpoint_url) this machine's own address toward its VPC, else a ConfigError
    ssh_cidr: Annotated[str | None, Env("ORCH_AWS_SSH_CIDR")] = None
    ssh_from_anywhere: bool = False  # consent to an ssh_cidr of 0.0.0.0/0 or ::/0
    # reach the nodes over SSH at their private IPs even when they have public ones: set for a
    # controller host, which runs inside the VPC as a member of the nodes' security group
    connect_private: Annotated[bool, Env("ORCH_AWS_CONNECT_PRIVATE")] = False
    spot_price_cache_s: float = Field(default=300.0, ge=0)
    ready_timeout_s: float = Field(default=600.0, gt=0)  # launch: wait for `running` and SSH
    poll_interval_s: float = Field(default=5.0, gt=0)
    max_api_attempts: int = Field(default=8, ge=1)  # tries per call on throttling and 5xx
    # launch returns once each node's sshd sends its banner on ssh_host:22 (off: once `running`;
    # for nodes this machine cannot reach directly)
    wait_for_ssh: bool = True

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(ip_network(value.strip(), strict=True))
        except ValueError as exc:
            raise ValueError(
                f"{value!r} is not an IP address or CIDR block ({exc}); give your own address,"
                " e.g. 203.0.113.7/32, or the block your addresses come from"
            ) from exc

    @model_validator(mode="after")
    def _not_the_whole_internet(self) -> AwsSettings:
        if (
            self.ssh_cidr
            and ip_network(self.ssh_cidr).prefixlen == 0
            and not self.ssh_from_anywhere
        ):
            raise ValueError(
                f"ssh_cidr {self.ssh_cidr} lets anyone on the internet try to log into the nodes;"
                " give your own address (e.g. 203.0.113.7/32), or set aws.ssh_from_anywhere:"
                " true if that is really meant"
            )
        return self

    @field_validator("regions", "ami_owners", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class StoreSettings(BaseModel):
    """How the checkpoint store of a job (`checkpoint.store`) is reached where AWS's defaults
    do not do: an S3-compatible service of one's own, or a sandbox."""

    model_config = ConfigDict(extra="forbid")

    # S3 API endpoint the controller uses (None: AWS's own)
    endpoint_url: Annotated[str | None, Env("ORCH_STORE_ENDPOINT_URL")] = None
    # the same endpoint as the nodes reach it, if it differs
    node_endpoint_url: Annotated[str | None, Env("ORCH_STORE_NODE_ENDPOINT_URL")] = None
    # None: the region of the job's nodes, else boto3's default
    region: Annotated[str | None, Env("ORCH_STORE_REGION")] = None


class CheckpointSettings(BaseModel):
    """Bounds on what checkpoint pulls bring to this machine (`cluster.checkpoints.limits`)."""

    model_config = ConfigDict(extra="forbid")

    # the most bytes one checkpoint, and one collection, may bring into the mirror; 0: no cap
    max_pull_bytes: Annotated[int, Env("ORCH_CHECKPOINT_MAX_PULL_BYTES")] = Field(
        default=100 * 1024**3, ge=0
    )


class LogSettings(BaseModel):
    """The node logs mirrored under ORCH_HOME/jobs/<id>/logs (see `cluster.log_files`)."""

    model_config = ConfigDict(extra="forbid")

    # cap per log file; 0: no cap
    max_bytes: Annotated[int, Env("ORCH_LOGS_MAX_BYTES")] = Field(default=50 * 1024 * 1024, ge=0)
    # rotated files kept per node log (node-0.log.1, ...)
    keep: Annotated[int, Env("ORCH_LOGS_KEEP")] = Field(default=3, ge=0)


LEDGER_BACKENDS = ("postgresql", "postgres", "sqlite")  # the databases `ledger.url` may name


class LedgerSettings(BaseModel):
    """Where the ledger lives (`orchestrator.ledger.database`)."""

    model_config = ConfigDict(extra="forbid")

    # A SQLAlchemy URL, e.g. postgresql+psycopg://orch@db:5432/orch (ORCH_DATABASE_URL);
    # None: the SQLite file ORCH_HOME/orch.db
    url: Annotated[str | None, Env("ORCH_DATABASE_URL")] = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        """A PostgreSQL or SQLite URL (the ledger reads the rest of it when it opens:
        `orchestrator.ledger.database`); blank is unset."""
        if value is None or not value.strip():
            return None
        scheme, found, _ = value.strip().partition("://")
        if not found or scheme.split("+")[0].lower() not in LEDGER_BACKENDS:
            shown = f"it starts with {scheme!r}" if found else "it has no scheme://"
            raise ValueError(
                f"not a PostgreSQL or SQLite URL ({shown}); give one such as"
                " postgresql+psycopg://orch@db.example.com:5432/orch, or leave it unset for"
                " the SQLite file under ORCH_HOME"
            )
        return value.strip()

    # On a shared ledger (`shared`), how long a controller's lease on its job lasts unless
    # renewed, and how often the controller renews it (`orchestrator.control.process.lease_keeper`)
    controller_lease: Annotated[float, Env("ORCH_CONTROLLER_LEASE")] = Field(default=30.0, gt=0)
    lease_renewal: Annotated[float, Env("ORCH_LEASE_RENEWAL")] = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _renewed_in_time(self) -> LedgerSettings:
        if self.lease_renewal * 2 > self.controller_lease:
            raise ValueError(
                f"lease_renewal ({self.lease_renewal:g} s) must be at most half of"
                f" controller_lease ({self.controller_lease:g} s), so that one failed renewal"
                " does not lose the lease"
            )
        return self

    @property
    def shared(self) -> bool:
        """Whether other machines may use this ledger: any `url` counts (the default SQLite
        file under ORCH_HOME is this ORCH_HOME's alone)."""
        return self.url is not None


class BudgetSettings(BaseModel):
    """Monthly caps on what every job of the ledger spends (a team's, when the ledger is shared
    through `ledger.url`); see `orchestrator.control.money.team_budget`. None: no cap."""

    model_config = ConfigDict(extra="forbid")

    # USD all jobs of the ledger (and its kept clusters between jobs) may spend in a UTC month
    monthly_usd: Annotated[Decimal | None, Env("ORCH_BUDGET_MONTHLY_USD")] = None
    # USD each owner label (`Settings.owner_label`, `Job.owner`) may spend in a UTC month
    user_monthly_usd: Annotated[Decimal | None, Env("ORCH_BUDGET_USER_MONTHLY_USD")] = None

    @field_validator("monthly_usd", "user_monthly_usd", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        """A blank value (`monthly_usd:` with nothing after it, or an empty variable) is no cap;
        a float from YAML is read by its text, so 0.1 is exactly 0.1."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, float):
            return str(value)
        return value

    @field_validator("monthly_usd", "user_monthly_usd")
    @classmethod
    def _positive(cls, value: Decimal | None) -> Decimal | None:
        if value is not None and (not value.is_finite() or value <= 0):
            raise ValueError(
                f"{value} is not a positive amount of USD; give the monthly cap in USD, e.g."
                " 500, or leave it unset for no cap"
            )
        return value

    @property
    def capped(self) -> bool:
        """Whether any monthly cap is set."""
        return self.monthly_usd is not None or self.user_monthly_usd is not None


class ControllerSettings(BaseModel):
    """Timing of the controller's periodic work (seconds) and its idleness thresholds."""

    model_config = ConfigDict(extra="forbid")

    # liveness, logs, GPU readings
    watch_interval: Annotated[float, Env("ORCH_WATCH_INTERVAL")] = Field(default=5.0, gt=0)
    # spend against the caps
    budget_interval: Annotated[float, Env("ORCH_BUDGET_INTERVAL")] = Field(default=10.0, gt=0)
    # how long a budget stop may take
    stop_allowance: Annotated[float, Env("ORCH_STOP_ALLOWANCE")] = Field(default=15.0, ge=0)
    # trainers' time to checkpoint on SIGTERM
    stop_grace: Annotated[float, Env("ORCH_STOP_GRACE")] = Field(default=60.0, ge=0)
    idle_util_pct: float = Field(default=5.0, ge=0, le=100)  # GPU busy threshold
    idle_cpu_pct: float = Field(default=10.0, ge=0)  # CPU fallback: % of one core, per node
    # ledger keeps one sample per window
    gpu_sample_every: Annotated[float, Env("ORCH_GPU_SAMPLE_EVERY")] = Field(default=30.0, gt=0)
    # nodes poll for spot notices
    notice_poll_interval: Annotated[float, Env("ORCH_NOTICE_POLL_INTERVAL")] = Field(
        default=5.0, gt=0
    )
    # no controller, no training: node ends
    deadman_timeout: Annotated[float, Env("ORCH_DEADMAN_TIMEOUT")] = Field(default=600.0, gt=0)
    # spot-only launches refused before failing
    launch_retries: Annotated[int, Env("ORCH_LAUNCH_RETRIES")] = Field(default=5, ge=0)
    # first wait between them (doubles)
    launch_backoff: Annotated[float, Env("ORCH_LAUNCH_BACKOFF")] = Field(default=10.0, ge=0)
    # spot policy: between two decisions
    policy_interval: Annotated[float, Env("ORCH_POLICY_INTERVAL")] = Field(default=5.0, gt=0)
    # spot policy: a restart's
    restart_overhead_prior: Annotated[float, Env("ORCH_RESTART_OVERHEAD_PRIOR")] = Field(
        default=720.0, ge=0
    )
    #   cost in seconds until the job has measured its own (12 min, the paper's 0.2 h)
    # budget.max_runtime of jobs that set none (seconds, or a duration such as 4h); with it,
    # `orch submit` on a paid provider does not ask before launching a job without a budget
    default_max_runtime: Annotated[Seconds | None, Env("ORCH_DEFAULT_MAX_RUNTIME")] = None
    # one push to the nodes (workdir, data, checkpoints put back) is stopped after this long
    push_timeout: Annotated[Seconds, Env("ORCH_PUSH_TIMEOUT")] = 3600.0
    # run when a job ends, with its JSON document on stdin (orchestrator.control.verbs.notify);
    # `orch submit --notify CMD` sets one job's own
    notify: Annotated[str | None, Env("ORCH_NOTIFY")] = None


class Settings(BaseModel):
    """Everything orch reads about its environment; built once per command and passed down."""

    model_config = ConfigDict(extra="forbid")

    home: Path
    local: LocalSettings = LocalSettings()
    aws: AwsSettings = AwsSettings()
    controller: ControllerSettings = ControllerSettings()
    store: StoreSettings = StoreSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    logs: LogSettings = LogSettings()
    ledger: LedgerSettings = LedgerSettings()
    budget: BudgetSettings = BudgetSettings()

    @property
    def db_path(self) -> Path:
        """The SQLite ledger's file; the ledger is elsewhere when `ledger.url` is set."""
        return self.home / "orch.db"

    @property
    def owner_label(self) -> str:
        """Who submits from here: `aws.owner`, else the login name. A label (the orch-owner
        tag, the key of per-user budgets), never proof of ownership."""
        import getpass

        return self.aws.owner or getpass.getuser()

    def job_dir(self, job_id: str) -> Path:
        return self.home / "jobs" / job_id

    def keys_dir(self, cluster: str) -> Path:
        return self.home / "keys" / cluster

    @property
    def local_root(self) -> Path:
        """Where the local provider keeps its nodes: `local.root`, else ORCH_HOME/local."""
        return self.local.root or self.home / "local"


def env_variables() -> dict[str, tuple[str, str]]:
    """ORCH_* variable -> (section, setting) of every setting marked with `Env`."""
    found: dict[str, tuple[str, str]] = {}
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name, info in model.model_fields.items():
            for mark in info.metadata:
                if isinstance(mark, Env):
                    found[mark.name] = (section, name)
    return found


_ENV_OVERRIDES = env_variables()


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
