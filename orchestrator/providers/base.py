"""The provider interface: what orch asks of a cloud, and nothing about SSH.

Lifecycle of a cluster, for every provider:

    plan(request, budget) -> what `launch(request)` would bring up and its price, launching
                        nothing (`orch submit --dry-run`)
    launch(request)  -> the nodes are running, reachable over SSH with `request.public_key`,
                        and billing has started at each `Instance.launched_at`
    list_owned(...)  -> what this provider runs for orch, answered from the cloud itself (tags,
                        on-disk node records), never from orch's database
    terminate(ids)   -> returns only when the provider has acknowledged that every node is gone;
                        billing of a node stops at the time returned. Idempotent: terminating a
                        node that is already gone is not an error; an id the provider cannot
                        find at all is (`InstancesNotFound`), so a caller never takes a node it
                        cannot see (another account, region or endpoint) for an ended one.
    identity()       -> the cloud identity the provider acts as (account, region, endpoint); a
                        job records it, and a controller acting as another refuses the job.

Ownership: every node carries the id of the ledger whose orch launched it
(`LaunchRequest.ledger_id` -> `Instance.ledger_id`). `list_owned` reports every orch node it
can see, whatever its ledger; callers end only the nodes of their own ledger
(`orchestrator.control.process.ownership`).

A provider never opens an SSH connection: it reports addresses and host keys, and the SSH layer
does the talking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from orchestrator.node.container import ContainerRuntime
    from orchestrator.node.guard_protocol import GuardTerms
    from orchestrator.providers.plan import DryRun
    from orchestrator.spec.model import Budget

Market = Literal["spot", "on-demand"]


@dataclass(frozen=True)
class LaunchRequest:
    """What `launch` is asked to bring up: `count` identical nodes for one job."""

    job_id: str  # the ledger's job id; tagged on every node
    cluster: str  # name of the group of nodes (one cluster per job attempt)
    count: int  # number of nodes: ranks 0..count-1, or those of `ranks`
    gpus_per_node: int  # GPUs (or, on CPU-only local nodes, trainer processes) per node
    public_key: str  # OpenSSH public key line that must be authorized on every node
    spot: bool | Literal["auto"] = False  # spot only / on-demand only / "auto": cheapest of both
    accelerator: str | None = None  # GPU model wanted (None: any)
    max_price_per_hour: Decimal | None = None  # refuse offers above this hourly price per node
    min_gpu_memory_gb: float | None = None  # least memory per GPU (None: any)
    disk_size_gb: int | None = None  # root volume per node, GB (None: the image's; AWS only)
    avoid_zones: tuple[str, ...] = ()  # zones where the job was just interrupted: tried last
    store: str | None = None  # the job's checkpoint store: the nodes must be able to write it
    guard: GuardTerms | None = None  # the job's limits for each node's guard, armed at boot
    #                                  (None: no guard; see orchestrator.node.guard)
    ledger_id: str | None = None  # id of the orch ledger the job is in; tagged on every node
    #                               (None: no ledger tag, e.g. a request built only for prices)
    instance_types: tuple[str, ...] = ()  # only these types, in order of preference (): any
    regions: tuple[str, ...] = ()  # only these regions (): the provider's configured ones
    zones: tuple[str, ...] = ()  # only these availability zones (): any
    zones_ordered: bool = False  # `zones` is an order of preference (a zone-aware spot
    #                              policy's choice): offers follow it before price
    image: str | None = None  # AMI id or AMI name pattern (None: the provider's configured one)
    ports: tuple[str, ...] = ()  # "N" or "A-B": opened to the submitting machine's address only
    attempt: int = 0  # the job's launch number (0 first, +1 per launch: a recovery, a
    #                   restart after its controller died, ...); part of the idempotency
    #                   token, so a retried call never launches twice while a new attempt
    #                   always launches new nodes
    ranks: tuple[int, ...] = ()  # the ranks of the nodes to launch, `count` of them, when not
    #                              0..count-1: replacements of lost nodes beside survivors
    container: bool = False  # the job runs in a container image: the nodes ready a runtime for
    #                          it at boot where their image lacks one (AWS: Docker, the NVIDIA
    #                          container toolkit on GPU nodes, the AWS CLI)
    ecr_login: bool = False  # the container image is in Amazon ECR and the spec gives no
    #                          registry login: the nodes log in with their instance role
    buckets: bool = False  # the job reads `s3://` data or writes outputs to a bucket: the
    #                        nodes do it with credentials of their own (an instance role)
    fleet: str | None = None  # provider ssh: the fleet whose machines the nodes are placed on

    def __post_init__(self) -> None:
        if self.ranks and len(self.ranks) != self.count:
            raise ValueError(f"{len(self.ranks)} rank(s) given for {self.count} node(s)")

    @property
    def node_ranks(self) -> tuple[int, ...]:
        """The rank of each node to launch, in launch order."""
        return self.ranks or tuple(range(self.count))


@dataclass(frozen=True)
class Instance:
    """One running node, as the provider sees it."""

    instance_id: str  # provider's id, unique across the provider (AWS: i-...; local: l-...)
    job_id: str  # job that owns the node (from its tags)
    cluster: str  # cluster the node belongs to (from its tags)
    rank: int  # node rank within the cluster, 0 is the master
    private_ip: str  # address the other nodes reach it at; node 0's is the torchrun master addr
    ssh_host: str  # address the controller connects to
    ssh_port: int  # port of the node's sshd
    ssh_user: str  # login user
    host_key: str  # the node's public host key ("ssh-ed25519 AAAA..."), pinned by the SSH layer
    interface: str  # interface carrying private_ip on the node (GLOO/NCCL_SOCKET_IFNAME)
    market: Market  # spot or on-demand, as launched
    instance_type: str  # provider's machine type name
    price_per_hour: Decimal  # USD per hour at launch time; recorded in the ledger, never re-read
    launched_at: datetime  # UTC; billing starts here
    tags: dict[str, str] = field(default_factory=dict)  # everything the provider tags it with
    zone: str | None = None  # availability zone (None: the provider has none)
    poweroff_command: str = "sudo shutdown -h now"  # how the node ends itself (dead-man
    #                                               switch); EC2 nodes terminate on shutdown
    metadata_url: str | None = None  # where the node reads its instance metadata (spot
    #                                  notices); None: EC2's http://169.254.169.254
    credentials: bool = False  # the node has cloud credentials of its own (an instance
    #                            profile) to reach the job's checkpoint store
    region: str | None = None  # the cloud region the node runs in (None: the provider has none)
    ledger_id: str | None = None  # the ledger that launched it, from its tags (None: no tag,
    #                               so no ledger can claim it by tag)
    container_runtime: ContainerRuntime | None = None  # how the node runs a job's container
    #                   image, GPU options included on a GPU node (None: it cannot, and a job
    #                   with a `container` is refused there)
    home: str | None = None  # an allocation on a shared machine: the node's own home there
    #                          (absolute), where all of its files live and its commands run
    #                          with HOME set to it (None: the login's home, the whole machine)
    gpu_indices: tuple[int, ...] | None = None  # the machine's GPUs this node may use (None:
    #                                             all of them)
    proxy_jump: str | None = None  # "user@addr[:port]": the node is reached through that host


@dataclass(frozen=True)
class CloudIdentity:
    """Who a provider acts as: where its calls go and whose nodes they can see.

    Two identities are the same only when every field is equal. Recorded as JSON on jobs and
    leases (`to_json`, `from_json`).
    """

    provider: str  # the provider's name ("aws", "local")
    account: str  # AWS: the account id (sts:GetCallerIdentity); local: "host:ORCH_HOME"
    region: str | None = None  # AWS: the regions in use, comma-separated; local: None
    endpoint: str | None = None  # the API endpoint override (None: the cloud's own endpoint)

    def describe(self) -> str:
        """One line for people: "aws account 123456789012, region us-east-1, endpoint ..."."""
        parts = [f"{self.provider} account {self.account}"]
        if self.region is not None:
            parts.append(f"region {self.region}")
        parts.append(f"endpoint {self.endpoint or 'default'}")
        return ", ".join(parts)

    def to_json(self) -> str:
        return json.dumps(
            {
                "provider": self.provider,
                "account": self.account,
                "region": self.region,
                "endpoint": self.endpoint,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> CloudIdentity:
        """The identity `to_json` wrote; raises ValueError on anything else."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("account"), str):
            raise ValueError(f"not a cloud identity: {text!r}")
        return cls(
            provider=str(raw.get("provider", "")),
            account=raw["account"],
            region=raw.get("region"),
            endpoint=raw.get("endpoint"),
        )


@dataclass(frozen=True)
class NodeEnd:
    """How a node that ended itself (its guard powered it off) ended, as far as known."""

    at: datetime | None  # UTC time billing stopped, as the provider says (None: unknown)
    kind: str  # the limit its guard acted on: max_runtime, budget, idle, deadman ("": unknown)
    message: str  # the guard's words, or the provider's


@runtime_checkable
class Provider(Protocol):
    """A source of machines. Implementations hold their own clients; no global state."""

    name: str

    def plan(self, request: LaunchRequest, budget: Budget) -> DryRun:
        """What `launch(request)` would try first, at what price, and (`DryRun.document`) the
        dry-run document that shows it; `budget` prices it for `budget.max_runtime`. Launches
        nothing and changes nothing; may ask the cloud for prices. Raises `CapacityError` when
        no offer fits the request at all.
        """
        ...

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start `request.count` nodes and return them, ordered by rank, once reachable.

        Either every node comes up or none is left running: on a partial failure the nodes that
        did start are terminated before the error (a `ProviderError`/`CapacityError`) is raised.
        """
        ...

    def terminate(self, instance_ids: list[str]) -> datetime:
        """End the given nodes and every process on them; return the UTC time billing stopped.

        Idempotent: ids of nodes that exist but already ended are skipped silently. Ids the
        provider cannot find at all raise `InstancesNotFound` after the others were ended (its
        `ended_at` is when their billing stopped), never counted as ended.
        """
        ...

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        """Live nodes orch launched that this provider can see (optionally those of one job),
        of every ledger: `Instance.ledger_id` says whose each is."""
        ...

    def identity(self) -> CloudIdentity:
        """The identity this provider acts as. Asked of the cloud at most once per provider
        object (cached); raises `ProviderError` when the cloud cannot say."""
        ...

    def preempted(self, instance_ids: list[str]) -> set[str]:
        """Those of the given nodes that the cloud took back (a spot reclaim), as it says.

        A node ended by anything else (the user, orch, a crash) is not in the set; neither is
        a node the provider knows nothing about.
        """
        ...

    def self_ended(self, instance_ids: list[str]) -> dict[str, NodeEnd]:
        """Those of the given nodes that powered themselves off (their guard acted), with
        when and why as far as the provider can tell. Nodes that run, that something else
        ended, or that the provider knows nothing about are left out."""
        ...


@dataclass(frozen=True)
class MarketPrices:
    """What one node-hour costs on each market, USD, for the job's resources."""

    spot: Decimal | None  # None: no spot offer fits the job
    on_demand: Decimal | None  # None: no on-demand offer fits the job


@dataclass(frozen=True)
class ZoneMarket:
    """What one availability zone offers the job's nodes, as far as the provider can tell."""

    zone: str  # availability zone, e.g. "us-east-1a"
    spot_available: bool | None  # spot for all the job's nodes can be had now; None: unknown
    spot_price: Decimal | None  # USD per node-hour of the cheapest fitting spot offer; None:
    #                             no spot offer fits the job there
    on_demand_price: Decimal | None  # USD per node-hour, cheapest fitting on-demand offer


@runtime_checkable
class MarketView(Protocol):
    """What a provider may tell the deadline-aware spot policies (optional: a provider without
    it is asked nothing, and spot counts as available)."""

    def spot_available(self, nodes: int = 1) -> bool | None:
        """Whether `nodes` spot nodes could be had now; None: the provider cannot tell."""
        ...

    def market_prices(self, request: LaunchRequest) -> MarketPrices:
        """Prices of the cheapest fitting offer on each market; may ask the cloud."""
        ...


@runtime_checkable
class ZoneMarketView(Protocol):
    """What a provider with availability zones may tell the zone-aware spot policies
    (`spot_policy: uniform-progress-mz`, ...); a provider without it counts as one zone."""

    def zone_markets(self, request: LaunchRequest) -> tuple[ZoneMarket, ...]:
        """Every zone where `request`'s nodes could run (its `zones` and `regions` only, when
        it lists them), by zone name; may ask the cloud. Raises `ProviderError` when the cloud
        cannot say."""
        ...
