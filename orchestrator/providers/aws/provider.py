"""The AWS provider: EC2 GPU instances, spot or on-demand, cheapest offer that fits first.

Lifecycle:

    launch(request)   rank offers (type x zone x market, `providers.offers`), then for each
                      offer in turn start every node in that ONE zone, one `run_instances` call
                      per node (each node has its own host key and rank tag), and wait until all
                      are `running` and then until each answers with an SSH banner on its
                      ssh_host:22 (EC2 says `running` before sshd listens), both within
                      `aws.ready_timeout_s`. A capacity refusal (`launch.CAPACITY_CODES`)
                      moves on to the next offer (the next zone, then the next type) at once,
                      after terminating the nodes that did start in the refused zone. Billing
                      of a node starts at its `LaunchTime` (`Instance.launched_at`); its price is
                      the offer's price. The offers are tried by `launching.NodeLauncher`. The
                      nodes join the network's group (SSH only) and their cluster's own group
                      (all traffic between its members, `cluster_network`), made when missing.
    list_owned(...)   instances tagged `orch-job` that are not shutting down or terminated, in
                      every region in use, whoever launched them: `Instance.ledger_id` (tag
                      `orch-ledger`) says which ledger's each is; `orch-owner` is a label.
    terminate(ids)    `terminate_instances`, then wait until EC2 reports every one as
                      `shutting-down` or `terminated`: billing stops then (the returned time).
                      Ids already ended are skipped; ids that no region in use knows raise
                      `InstancesNotFound` (after the others are ended). Then the cluster groups
                      (`cluster_network`) left without an instance are deleted (`leftovers`).
    identity()        account (sts:GetCallerIdentity), regions in use and endpoint; asked once.
    preempted(ids)    the ids EC2 reclaimed (state reason `Server.SpotInstanceTermination`): the
                      controller treats those as spot interruptions, not failures.

Throttling (RequestLimitExceeded) and 5xx answers are retried by botocore's "standard" retry
mode, with exponential backoff, at most `aws.max_api_attempts` tries per call; except
RunInstances, whose calls make one try each and are repeated by `launching` (EC2 refuses
capacity with HTTP 500 too, and a capacity refusal moves on to the next offer at once).
Idempotency: each node's call carries a ClientToken, and the node is tagged with it; a live
instance with that tag is adopted instead of launched, so a retried launch (same request) never
starts a node twice; after any failed launch the instances carrying one of its nodes' tokens are
terminated before the error is raised (see `launching`).

Host keys are generated at launch and passed in user data; see the `launch` module. The
provider never connects to a node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from orchestrator.config import Settings
from orchestrator.errors import (
    CapacityError,
    ConfigError,
    InstancesNotFound,
    OrchError,
    ProviderError,
)
from orchestrator.providers.aws import network as aws_network
from orchestrator.providers.aws.catalog import Catalog, load_catalog
from orchestrator.providers.aws.container_runtime import local_cloud_runtime
from orchestrator.providers.aws.ec2_requests import (
    GONE_STATES,
    LIVE_STATES,
    SELF_SHUTDOWN_CODE,
    SPOT_RECLAIM_CODE,
    TAG_JOB,
    instance_from_description,
    transition_time,
)
from orchestrator.providers.aws.leftovers import Leftovers
from orchestrator.providers.aws.node_launcher import NodeLauncher, Refused
from orchestrator.providers.base import (
    CloudIdentity,
    Instance,
    LaunchRequest,
    MarketPrices,
    NodeEnd,
    ZoneMarket,
)
from orchestrator.providers.offers import (
    Offer,
    OfferQuery,
    SpotPriceSource,
    cheapest_prices,
    collect_offers,
    zone_markets,
)
from orchestrator.providers.plan import DryRun, offer_plan, offers_dry_run
from orchestrator.spec.model import Budget
from orchestrator.spec.placement import zone_region

if TYPE_CHECKING:
    from orchestrator.node.container import ContainerRuntime

_CHUNK = 200  # ids per describe/terminate call

# The dead-man switch's poweroff on hosts of a cloud running on this machine (see `_instance`):
# they share its software, so their `shutdown` would stop this machine, not an instance. The
# guard cloud-init arms on them powers off with `launching.LOCAL_CLOUD_GUARD_POWEROFF`.
LOCAL_CLOUD_POWEROFF = "echo 'dead-man switch: hosts of a local cloud are not powered off' >&2"


class AwsProvider:
    """EC2 nodes for orch. See the module docstring for the lifecycle and its guarantees.

    The constructor does no I/O; boto3 clients are built on first use, one per region, from
    `settings.aws` (`endpoint_url` set: every call goes there, as the tests do with moto).
    """

    name = "aws"

    def __init__(
        self,
        settings: Settings,
        *,
        catalog: Catalog | None = None,
        spot_source: SpotPriceSource | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.aws = settings.aws
        self._catalog = catalog
        self._clients: dict[str, Any] = {}
        self._launch_clients: dict[str, Any] = {}
        self._iam: Any = None
        self._runtime: ContainerRuntime | None = None  # of a cloud on this machine's hosts
        self._identity: CloudIdentity | None = None
        self._launcher = NodeLauncher(self, sleep=sleep)
        self._leftovers = Leftovers(self, self._launcher)
        self.spot_source = spot_source or SpotPriceSource(
            self.client, ttl_s=self.aws.spot_price_cache_s
        )

    # --- clients, offers ------------------------------------------------------------------------

    def client(self, region: str) -> Any:
        """The EC2 client of `region` (built once; retries throttling and 5xx with backoff)."""
        if region not in self._clients:
            self._clients[region] = boto3.client(
                "ec2",
                region_name=region,
                endpoint_url=self.aws.endpoint_url,
                config=Config(
                    # total: tries, the first one included ("max_attempts" counts retries)
                    retries={"mode": "standard", "total_max_attempts": self.aws.max_api_attempts},
                    connect_timeout=10,
                    read_timeout=60,
                ),
            )
        return self._clients[region]

    def launch_client(self, region: str) -> Any:
        """The EC2 client of `region` that RunInstances goes through: one try per call, so a
        capacity refusal (HTTP 500) reaches the provider at once; see `launching`."""
        if region not in self._launch_clients:
            self._launch_clients[region] = boto3.client(
                "ec2",
                region_name=region,
                endpoint_url=self.aws.endpoint_url,
                config=Config(
                    retries={"mode": "standard", "total_max_attempts": 1},
                    connect_timeout=10,
                    read_timeout=60,
                ),
            )
        return self._launch_clients[region]

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    @property
    def owner(self) -> str:
        """Value of the orch-owner tag this provider writes and lists."""
        return self.settings.owner_label

    def regions(self) -> list[str]:
        return aws_network.regions(self.aws)

    def offers(self, query: OfferQuery, regions: list[str] | None = None) -> list[Offer]:
        """Ranked offers for `query` in `regions` (None: the regions in use); asks EC2 for
        zones and spot prices."""
        where = self.regions() if regions is None else regions
        return self._api(
            "list offers",
            lambda: collect_offers(self.catalog, query, regions=where, source=self.spot_source),
        )

    def request_regions(self, request: LaunchRequest) -> list[str]:
        """The regions a request may launch in: its own (`resources.region`, or its zones'
        regions), which must be among the regions in use, since those are the ones orch lists
        and ends nodes in; else all regions in use. `ConfigError` names a region outside."""
        in_use = self.regions()
        wanted = list(request.regions) or list(dict.fromkeys(zone_region(z) for z in request.zones))
        outside = [r for r in wanted if r not in in_use]
        if outside:
            raise ConfigError(
                f"region {', '.join(outside)} (resources.region or zone) is not among the "
                f"regions orch uses: {', '.join(in_use)}",
                hint="add it to aws.regions (ORCH_AWS_REGIONS), so that orch also lists and "
                "ends nodes there",
            )
        return wanted or in_use

    def _request_offers(self, request: LaunchRequest, **changes: object) -> list[Offer]:
        query = replace(OfferQuery.from_resources(request), **changes)  # type: ignore[arg-type]
        return self.offers(query, self.request_regions(request))

    # --- Provider interface ---------------------------------------------------------------------

    def plan(self, request: LaunchRequest, budget: Budget) -> DryRun:
        """The cheapest fitting offer (asks EC2 for zones and spot prices), with the ten
        cheapest listed in the document; `CapacityError` when no offer fits at all."""
        offers = self._request_offers(request)
        if not offers:
            raise CapacityError(
                "no AWS offer fits the job's resources (GPU type, count, memory, max price, "
                "instance types, regions, zones)",
                hint="`orch catalog` lists the instance types; relax resources or "
                "max_price_per_hour",
            )
        plan = offer_plan(request, budget, offers[0], provider=self.name)
        return DryRun(plan, offers_dry_run(request, budget, offers, provider=self.name))

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start `request.count` nodes in one zone of the cheapest offer that has capacity;
        with `request.zones_ordered` the zones' order comes before price, and offers in
        `request.avoid_zones` come last (`offers.launch_order`).

        Returns them ordered by rank once all are `running` and answer SSH (unless
        `aws.wait_for_ssh` is off). Raises `CapacityError` listing every offer tried when none
        could be launched (or none fits), and `ProviderError` on any other AWS error or when
        the nodes are not up within `aws.ready_timeout_s`; either way no node of this launch is
        left running. A request with a checkpoint store launches its nodes with the
        configured instance profile, and without one raises `ConfigError` before any launch.
        """
        self._launcher.check_credentials(request)
        offers = self._request_offers(request)
        if not offers:
            raise CapacityError(
                f"no AWS offer fits {request.gpus_per_node} x {request.accelerator or 'any GPU'}"
                f" (spot={request.spot}, max ${request.max_price_per_hour}/h)"
                f" in {', '.join(request.zones or self.request_regions(request))}",
                hint="relax resources (accelerator, max_price_per_hour, spot) or add regions",
            )
        return self._launcher.launch(request, offers)

    def terminate(self, instance_ids: list[str], *, keep_cluster: bool = False) -> datetime:
        """Terminate the nodes and wait until EC2 acknowledges each (shutting-down/terminated).

        Returns the UTC time of that acknowledgement: billing of the nodes stops there. Ids that
        are already shutting down or terminated are skipped. Ids that no region in use knows (an
        instance of another account, region or endpoint, or none at all) raise
        `InstancesNotFound` once the others are ended: they are never reported as ended. Raises
        `ProviderError` if EC2 has not acknowledged within `aws.ready_timeout_s`.

        The nodes' cluster groups that no instance is left in are deleted after that time
        (waiting, where EC2 asks for it, until the nodes are terminated), and so are their job
        profiles (`node_roles`) that no live node holds; what cannot be is left to a later
        sweep, never an error. `keep_cluster` leaves both (a launch moving on to its next
        offer, which uses them at once).
        """
        ids = list(dict.fromkeys(instance_ids))
        unknown = set(ids)
        described: dict[str, list[dict[str, Any]]] = {}
        for region in self.regions() if ids else []:
            ec2 = self.client(region)
            described[region] = self._describe(region, ids)
            unknown -= {d["InstanceId"] for d in described[region]}
            live = [
                d["InstanceId"] for d in described[region] if d["State"]["Name"] not in GONE_STATES
            ]
            for i in range(0, len(live), _CHUNK):
                self._api(
                    "terminate instances",
                    lambda ec2=ec2, chunk=live[i : i + _CHUNK]: ec2.terminate_instances(
                        InstanceIds=chunk
                    ),
                )
            self._launcher.wait(region, live, GONE_STATES, "shutting-down")
        ended_at = datetime.now(UTC)
        if not keep_cluster:
            self._leftovers.end(described)
        if unknown:
            missing = tuple(i for i in ids if i in unknown)
            raise InstancesNotFound(
                f"EC2 in {', '.join(self.regions())} (endpoint "
                f"{self.aws.endpoint_url or 'default'}) knows no instance {', '.join(missing)}: "
                "not ended, and not counted as ended",
                instance_ids=missing,
                ended_at=ended_at,
                hint="run orch with the AWS credentials, ORCH_AWS_REGIONS and endpoint that "
                "launched them",
            )
        return ended_at

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        """Live (pending, running, stopping, stopped) instances tagged by orch, from EC2's tags.

        An instance counts when it has an `orch-job` tag (equal to `job_id` when given), whoever
        launched it: its `orch-ledger` tag, as `Instance.ledger_id`, says which ledger it is
        (callers end only their own, `control.process.ownership`). Ordered by job, cluster, rank.
        """
        job_filter = (
            {"Name": f"tag:{TAG_JOB}", "Values": [job_id]}
            if job_id is not None
            else {"Name": "tag-key", "Values": [TAG_JOB]}
        )
        filters = [job_filter, {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
        found: list[Instance] = []
        for region in self.regions():
            for desc in self._describe_filtered(region, filters):
                node = self._instance(desc, region)
                if node is not None:
                    found.append(node)
        return sorted(found, key=lambda n: (n.job_id, n.cluster, n.rank, n.instance_id))

    def identity(self) -> CloudIdentity:
        """The account (sts:GetCallerIdentity), the regions in use and the endpoint override
        (None: AWS's own). Asked of STS once per provider; `ProviderError` when STS cannot say
        (no or bad credentials)."""
        if self._identity is None:
            regions = self.regions()
            sts = boto3.client(
                "sts",
                region_name=regions[0],
                endpoint_url=self.aws.endpoint_url,
                config=Config(
                    retries={"mode": "standard", "total_max_attempts": self.aws.max_api_attempts},
                    connect_timeout=10,
                    read_timeout=60,
                ),
            )
            reply = self._api("ask STS who this is", sts.get_caller_identity)
            self._identity = CloudIdentity(
                provider=self.name,
                account=str(reply["Account"]),
                region=",".join(sorted(regions)),
                endpoint=self.aws.endpoint_url,
            )
        return self._identity

    # --- beyond the protocol --------------------------------------------------------------------

    def iam_client(self) -> Any:
        """The IAM client (IAM is global: the first region in use signs its calls)."""
        if self._iam is None:
            self._iam = boto3.client(
                "iam",
                region_name=self.regions()[0],
                endpoint_url=self.aws.endpoint_url,
                config=Config(
                    retries={"mode": "standard", "total_max_attempts": self.aws.max_api_attempts},
                    connect_timeout=10,
                    read_timeout=60,
                ),
            )
        return self._iam

    def sweep_job_profiles(self) -> list[str]:
        """Delete this owner's job profiles left behind (`node_roles.sweep`); never raises."""
        return self._leftovers.sweep_job_profiles()

    def sweep_groups(self, region: str) -> list[str]:
        """Delete this owner's cluster groups in `region` that were left behind (made over
        `cluster_network.LEAK_GRACE_S` ago, no instance in them); returns their ids. Never
        raises: what it cannot delete now, a later sweep does."""
        return self._leftovers.sweep_groups(region)

    def preempted(self, instance_ids: list[str]) -> set[str]:
        """The ids EC2 reclaimed as spot capacity (state reason `Server.SpotInstanceTermination`).

        For the controller: such a node was interrupted, not crashed; a recovery follows. A node
        stopped or terminated by anything else (the user, orch, a failure) is not in the set.
        """
        ids = list(dict.fromkeys(instance_ids))
        reclaimed: set[str] = set()
        for region in self.regions() if ids else []:
            for desc in self._describe(region, ids):
                reason = desc.get("StateReason") or {}
                code, message = reason.get("Code", ""), reason.get("Message", "")
                if SPOT_RECLAIM_CODE in (code, message.split(":")[0]):
                    reclaimed.add(desc["InstanceId"])
        return reclaimed

    # --- what the markets offer (`MarketView`) ------------------------------------------------

    def spot_available(self, nodes: int = 1) -> bool | None:
        """EC2 does not say whether a spot launch would be granted before it is tried: None."""
        return None

    def market_prices(self, request: LaunchRequest) -> MarketPrices:
        """Prices of the cheapest offer that fits `request` on each market (asks EC2)."""
        offers = self._request_offers(request, spot="auto")
        return cheapest_prices(offers)

    def zone_markets(self, request: LaunchRequest) -> tuple[ZoneMarket, ...]:
        """Per zone that could take `request`'s nodes, the cheapest offer on each market (asks
        EC2, cached `aws.spot_price_cache_s`). EC2 does not say whether spot would be granted
        before a launch tries: `spot_available` is None where a spot offer fits."""
        return zone_markets(self._request_offers(request, spot="auto"))

    # --- describe helpers -----------------------------------------------------------------------

    def _instance(self, desc: dict[str, Any], region: str) -> Instance | None:
        instance = instance_from_description(
            desc, ssh_user=self.aws.ssh_user, interface=self.aws.interface,
            connect_private=self.aws.connect_private, gpu_types=self.gpu_types(),
        )  # fmt: skip
        if instance is not None:
            instance = replace(instance, region=region)
        if instance is not None and self._local_cloud():
            # The hosts of a cloud on this machine (moto, `orch sandbox aws`) share its
            # software: their `shutdown` would stop this machine, not an instance, and
            # Docker there would be this machine's daemon in this machine's network, not the
            # host's: they run podman in their own namespaces, as local nodes do.
            instance = replace(
                instance,
                poweroff_command=LOCAL_CLOUD_POWEROFF,
                container_runtime=self._local_cloud_runtime(),
            )
        return instance

    def gpu_types(self) -> frozenset[str]:
        """The instance types the catalog lists with GPUs."""
        return frozenset(t.name for t in self.catalog.types if t.gpus > 0)

    def self_ended(self, instance_ids: list[str]) -> dict[str, NodeEnd]:
        """Nodes that shut themselves down (state reason `Client.InstanceInitiatedShutdown`:
        their guard's poweroff, EC2 terminating them on shutdown). EC2 keeps no word of why:
        `kind` is empty; the time is that of the state transition when EC2 states one."""
        ids = list(dict.fromkeys(instance_ids))
        ended: dict[str, NodeEnd] = {}
        for region in self.regions() if ids else []:
            for desc in self._describe(region, ids):
                reason = desc.get("StateReason") or {}
                code, message = reason.get("Code", ""), reason.get("Message", "")
                if SELF_SHUTDOWN_CODE in (code, message.split(":")[0]):
                    ended[desc["InstanceId"]] = NodeEnd(
                        at=transition_time(desc.get("StateTransitionReason") or ""),
                        kind="",
                        message="the node shut itself down (its guard)",
                    )
        return ended

    def _local_cloud(self) -> bool:
        return aws_network.is_local_endpoint(self.aws.endpoint_url)

    def _local_cloud_runtime(self) -> ContainerRuntime:
        """podman on a cloud on this machine's hosts; plain HTTP to the registries of
        `local.insecure_registries`, as for local nodes."""
        if self._runtime is None:
            insecure = self.settings.local.insecure_registries
            self._runtime = local_cloud_runtime(insecure)
        return self._runtime

    def _describe(self, region: str, ids: Iterable[str]) -> list[dict[str, Any]]:
        """Descriptions of the ids EC2 knows in `region` (unknown ids are left out, not errors)."""
        ids = list(ids)
        found: list[dict[str, Any]] = []
        for i in range(0, len(ids), _CHUNK):
            found += self._describe_filtered(
                region, [{"Name": "instance-id", "Values": ids[i : i + _CHUNK]}]
            )
        return found

    def _describe_filtered(self, region: str, filters: list[dict]) -> list[dict[str, Any]]:
        def call() -> list[dict[str, Any]]:
            pages = (
                self.client(region).get_paginator("describe_instances").paginate(Filters=filters)
            )
            return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

        return self._api(f"describe instances in {region}", call)

    def _api(self, what: str, call: Callable[[], Any]) -> Any:
        """Run `call`, turning AWS failures (after botocore's retries) into `ProviderError`."""
        try:
            return call()
        except (OrchError, Refused):
            raise
        # ResponseParserError: an answer that is not EC2's (an HTML error page); botocore does
        # not count it among its own errors
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise ProviderError(
                f"AWS failed to {what}: {exc}",
                hint="check credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID) and the region",
            ) from exc
