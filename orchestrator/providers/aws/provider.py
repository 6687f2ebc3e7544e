"""The AWS provider: EC2 GPU instances, spot or on-demand, cheapest offer that fits first.

Lifecycle:

    launch(request)   rank offers (type x zone x market, `providers.offers`), then for each
                      offer in turn start every node in that ONE zone, one `run_instances` call
                      per node (each node has its own host key and rank tag), and wait until all
                      are `running` and then until each answers with an SSH banner on its
                      ssh_host:22 (EC2 says `running` before sshd listens), both within
                      `aws.ready_timeout_s`. A capacity refusal (`aws_launch.CAPACITY_CODES`)
                      moves on to the next offer (the next zone, then the next type) at once,
                      after terminating the nodes that did start in the refused zone. Billing
                      of a node starts at its `LaunchTime` (`Instance.launched_at`); its price is
                      the offer's price.
    list_owned(...)   instances tagged `orch-job` that are not shutting down or terminated, in
                      every region in use, whoever launched them: `Instance.ledger_id` (tag
                      `orch-ledger`) says which ledger's each is; `orch-owner` is a label.
    terminate(ids)    `terminate_instances`, then wait until EC2 reports every one as
                      `shutting-down` or `terminated`: billing stops then (the returned time).
                      Ids already ended are skipped; ids that no region in use knows raise
                      `InstancesNotFound` (after the others are ended).
    identity()        account (sts:GetCallerIdentity), regions in use and endpoint; asked once.
    preempted(ids)    the ids EC2 reclaimed (state reason `Server.SpotInstanceTermination`): the
                      controller treats those as spot interruptions, not failures.

Idempotency: each node's call carries a ClientToken derived from job, cluster, attempt, rank and
offer, and the node is tagged with it; before launching, a live instance with that tag is adopted
instead, so a retried launch (same request) never starts a node twice. Throttling
(RequestLimitExceeded) and 5xx answers are retried by botocore's "standard" retry mode, with
exponential backoff, at most `aws.max_api_attempts` tries per call; except RunInstances: EC2
refuses capacity with HTTP 500, which botocore would retry for half a minute before orch could
try the next zone, so its calls go through a client that makes one try, and the provider
repeats throttled and other 5xx answers itself (same backoff and limit, looking for the node by
its token before each repeat), while a capacity code moves on at once. After any failed launch
the instances carrying one of its nodes' tokens are looked up and terminated before the error
is raised: a call whose answer was lost on its last try started a node orch never heard of.

Host keys are generated here and passed in user data; see `aws_launch`. The provider never
connects to a node.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.parsers import ResponseParserError

from orchestrator.config import Settings
from orchestrator.errors import (
    CapacityError,
    ConfigError,
    InstancesNotFound,
    OrchError,
    ProviderError,
)
from orchestrator.node.guard_protocol import AWS_POWEROFF
from orchestrator.providers.aws import network as aws_network
from orchestrator.providers.aws.catalog import Catalog, load_catalog
from orchestrator.providers.aws.launch import (
    CAPACITY_CODES,
    GONE_STATES,
    LIVE_STATES,
    SELF_SHUTDOWN_CODE,
    SPOT_RECLAIM_CODE,
    TAG_JOB,
    TAG_TOKEN,
    HostKey,
    client_token,
    error_code,
    http_status,
    instance_from_description,
    launch_backoff_s,
    launch_retryable,
    new_host_key,
    node_tags,
    run_instances_args,
    transition_time,
    user_data,
)
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
    launch_order,
    zone_markets,
)
from orchestrator.providers.plan import DryRun, offer_plan, offers_dry_run
from orchestrator.providers.ssh_banner import answers_ssh
from orchestrator.spec.model import Budget
from orchestrator.spec.placement import zone_region

_CHUNK = 200  # ids per describe/terminate call

# The dead-man switch's poweroff on hosts of a cloud running on this machine (see `_instance`).
# A cloud on this machine (`orch sandbox aws`) gives its hosts a `shutdown` of their own at
# this path, which ends the instance; a guard where there is none says it cannot power off.
LOCAL_CLOUD_GUARD_POWEROFF = "/usr/local/sbin/shutdown -h now"
LOCAL_CLOUD_POWEROFF = "echo 'dead-man switch: hosts of a local cloud are not powered off' >&2"


@dataclass(frozen=True)
class Attempt:
    """One offer tried by `launch`, and why it was refused."""

    offer: Offer
    code: str  # AWS error code, or "NoSubnet" / "NotRunning"
    message: str

    def line(self) -> str:
        o = self.offer
        return f"{o.instance_type} {o.market} in {o.zone} at ${o.price_per_hour}/h: {self.code}"


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
        # per ClientToken: a repeated call must send the same parameters (EC2 refuses a token
        # reused with others: IdempotentParameterMismatch), host key included
        self._host_keys: dict[str, HostKey] = {}
        self._user_data: dict[str, str] = {}  # by launch token
        self._networks: dict[tuple[object, ...], aws_network.Network] = {}
        self._identity: CloudIdentity | None = None
        self._sleep = sleep
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
        capacity refusal (HTTP 500) reaches the provider at once; see `_run_instances`."""
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
        if request.store:
            self._instance_profile()
        offers = self._request_offers(request)
        if not offers:
            raise CapacityError(
                f"no AWS offer fits {request.gpus_per_node} x {request.accelerator or 'any GPU'}"
                f" (spot={request.spot}, max ${request.max_price_per_hour}/h)"
                f" in {', '.join(request.zones or self.request_regions(request))}",
                hint="relax resources (accelerator, max_price_per_hour, spot) or add regions",
            )
        tried: list[Attempt] = []
        for offer in launch_order(offers, request):
            try:
                return self._launch_offer(request, offer)
            except _Refused as refused:
                tried.append(Attempt(offer, refused.code, refused.message))
        raise CapacityError(
            "no AWS capacity for the job; tried:\n    " + "\n    ".join(a.line() for a in tried),
            hint="retry later, allow on-demand (spot: auto), or another accelerator or region",
        )

    def terminate(self, instance_ids: list[str]) -> datetime:
        """Terminate the nodes and wait until EC2 acknowledges each (shutting-down/terminated).

        Returns the UTC time of that acknowledgement: billing of the nodes stops there. Ids that
        are already shutting down or terminated are skipped. Ids that no region in use knows (an
        instance of another account, region or endpoint, or none at all) raise
        `InstancesNotFound` once the others are ended: they are never reported as ended. Raises
        `ProviderError` if EC2 has not acknowledged within `aws.ready_timeout_s`.
        """
        ids = list(dict.fromkeys(instance_ids))
        unknown = set(ids)
        for region in self.regions() if ids else []:
            ec2 = self.client(region)
            described = self._describe(region, ids)
            unknown -= {d["InstanceId"] for d in described}
            live = [d["InstanceId"] for d in described if d["State"]["Name"] not in GONE_STATES]
            for i in range(0, len(live), _CHUNK):
                self._api(
                    "terminate instances",
                    lambda ec2=ec2, chunk=live[i : i + _CHUNK]: ec2.terminate_instances(
                        InstanceIds=chunk
                    ),
                )
            self._wait(region, live, GONE_STATES, "shutting-down")
        ended_at = datetime.now(UTC)
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
        (callers end only their own, `control.ownership`). Ordered by job, cluster, rank.
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

    # --- launch internals -----------------------------------------------------------------------

    def _instance_profile(self) -> str:
        """The instance profile that lets nodes write the job's checkpoint store."""
        profile = self.aws.instance_profile or aws_network.tf_outputs(self.aws).instance_profile
        if not profile:
            raise ConfigError(
                "the job has a checkpoint store, and its nodes need credentials to write it: "
                "no instance profile is configured",
                hint="apply infra/ with checkpoint_store set (its `instance_profile` output), "
                "or set aws.instance_profile (ORCH_AWS_INSTANCE_PROFILE)",
            )
        return profile

    def _network(self, region: str, request: LaunchRequest) -> aws_network.Network:
        key = (region, request.public_key.strip(), request.image, request.ports)
        if key not in self._networks:
            self._networks[key] = self._api(
                f"prepare the network in {region}",
                lambda: aws_network.resolve_network(
                    self.client(region),
                    region,
                    self.aws,
                    request.public_key,
                    image=request.image,
                    ports=request.ports,
                ),
            )
        return self._networks[key]

    def _launch_offer(self, request: LaunchRequest, offer: Offer) -> list[Instance]:
        """All nodes on `offer`, or `_Refused` (capacity) with none of them left running."""
        network = self._network(offer.region, request)
        image_gb, disk_gb = network.root_volume_gb, request.disk_size_gb
        if disk_gb is not None and image_gb is not None and disk_gb < image_gb:
            raise ConfigError(
                f"resources.disk_size_gb is {disk_gb} GB, smaller than the {image_gb} GB root "
                f"volume of image {network.image_id}",
                hint=f"set resources.disk_size_gb to at least {image_gb}, or leave it out",
            )
        subnet = network.subnets.get(offer.zone)
        if subnet is None:
            raise _Refused("NoSubnet", f"no subnet configured in {offer.zone}")
        ids: list[str] = []
        try:
            for rank in request.node_ranks:
                ids.append(self._launch_node(request, rank, offer, network, subnet))
            deadline = time.monotonic() + self.aws.ready_timeout_s
            self._wait(offer.region, ids, frozenset({"running"}), "running", deadline=deadline)
            by_id = {d["InstanceId"]: d for d in self._describe(offer.region, ids)}
            nodes = [
                n for n in (self._instance(by_id[i], offer.region) for i in ids) if n is not None
            ]
            if self.aws.wait_for_ssh:
                self._wait_ssh(offer.region, nodes, deadline)
            return nodes
        except BaseException as exc:
            tokens = [client_token(request, rank, offer) for rank in request.node_ranks]
            try:
                # A RunInstances whose answer was lost on its last try started a node whose id
                # orch never heard: its token tag finds it.
                ids = list(dict.fromkeys(ids + self._launched_with(offer.region, tokens)))
                self.terminate(ids)
            except Exception as cleanup:
                exc.add_note(
                    f"terminating the partial launch {ids or tokens} failed too: {cleanup}"
                )
            raise

    def _launched_with(self, region: str, tokens: list[str]) -> list[str]:
        """Ids of the live instances launched by calls with these ClientTokens (their tag)."""
        if not tokens:
            return []
        found = self._describe_filtered(
            region,
            [
                {"Name": f"tag:{TAG_TOKEN}", "Values": tokens},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ],
        )
        return [d["InstanceId"] for d in found]

    def _launch_node(
        self,
        request: LaunchRequest,
        rank: int,
        offer: Offer,
        network: aws_network.Network,
        subnet: str,
    ) -> str:
        """Start one node (or find it started by an earlier try of the same request)."""
        token = client_token(request, rank, offer)
        tries = 0
        while True:
            adopted = self._describe_filtered(
                offer.region,
                [
                    {"Name": f"tag:{TAG_TOKEN}", "Values": [token]},
                    {"Name": "instance-state-name", "Values": ["pending", "running"]},
                ],
            )
            if adopted:  # a retried launch: that node already exists
                return adopted[0]["InstanceId"]
            tries += 1
            launched = self._run_instances(request, rank, offer, network, subnet, token, tries)
            if launched is not None:
                return launched
            self._sleep(launch_backoff_s(tries, random.random()))

    def _run_instances(
        self,
        request: LaunchRequest,
        rank: int,
        offer: Offer,
        network: aws_network.Network,
        subnet: str,
        token: str,
        tries: int,
    ) -> str | None:
        """One RunInstances call: the new instance's id, or None when the call may be repeated
        (throttled, a 5xx other than capacity, no answer) and `tries` < `aws.max_api_attempts`.
        Capacity refusals raise `_Refused` at once; anything else `ProviderError`."""
        if token not in self._host_keys:
            self._host_keys[token] = new_host_key()
            # The same text on every try: EC2 refuses a repeated token with other parameters.
            self._user_data[token] = user_data(
                request.public_key, self._host_keys[token], self._guard_terms(request, offer)
            )
        host_key = self._host_keys[token]
        args = run_instances_args(
            offer,
            image_id=network.image_id,
            subnet_id=subnet,
            security_group_ids=network.security_group_ids,
            key_name=network.key_name,
            tags=node_tags(
                request, rank, offer, owner=self.owner, host_key=host_key.public_line, token=token
            ),
            token=token,
            user_data_text=self._user_data[token],
            max_price=request.max_price_per_hour if offer.market == "spot" else None,
            instance_profile=self._instance_profile() if request.store else None,
            root_device_name=network.root_device_name,
            # the image's own size unless the spec asks for more: the size its root mapping
            # gives, which is what EC2 takes when none is sent (None: EC2's choice)
            disk_size_gb=request.disk_size_gb or network.root_volume_gb,
        )
        repeat = tries < self.aws.max_api_attempts
        try:
            reply = self.launch_client(offer.region).run_instances(**args)
        except ClientError as exc:
            code = error_code(exc)
            if code in CAPACITY_CODES:
                raise _Refused(code, str(exc)) from exc
            if repeat and launch_retryable(code, http_status(exc)):
                return None
            raise ProviderError(f"EC2 refused to launch {offer.instance_type}: {exc}") from exc
        except (BotoConnectionError, HTTPClientError, ResponseParserError) as exc:
            if repeat:  # the call may have gone through: the token lookup finds its node
                return None
            raise ProviderError(f"EC2 could not be reached: {exc}") from exc
        except BotoCoreError as exc:
            raise ProviderError(f"EC2 could not be reached: {exc}") from exc
        return reply["Instances"][0]["InstanceId"]

    def _wait(
        self,
        region: str,
        ids: list[str],
        wanted: frozenset[str],
        label: str,
        *,
        deadline: float | None = None,
    ) -> None:
        """Poll until every id is in a `wanted` state. A node that is gone while waiting for
        `running` is a refusal (e.g. spot capacity vanished); passing `deadline` (monotonic;
        default `aws.ready_timeout_s` from now) is a `ProviderError`."""
        if not ids:
            return
        if deadline is None:
            deadline = time.monotonic() + self.aws.ready_timeout_s
        while True:
            states = {d["InstanceId"]: d["State"]["Name"] for d in self._describe(region, ids)}
            if all(states.get(i) in wanted for i in ids):
                return
            if "running" in wanted and any(states.get(i, "terminated") in GONE_STATES for i in ids):
                raise _Refused("NotRunning", f"nodes ended while starting: {states}")
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"EC2 nodes in {region} not {label} after {self.aws.ready_timeout_s:.0f} s:"
                    f" {states}"
                )
            self._sleep(self.aws.poll_interval_s)

    def _wait_ssh(self, region: str, nodes: list[Instance], deadline: float) -> None:
        """Poll until every node's sshd sends its banner on ssh_host:ssh_port (a TCP connect
        and one read, no SSH). A node gone meanwhile is a refusal; `deadline` passing is a
        `ProviderError` that names the nodes still silent."""
        silent = list(nodes)
        while True:
            silent = [n for n in silent if not answers_ssh(n.ssh_host, n.ssh_port)]
            if not silent:
                return
            states = {
                d["InstanceId"]: d["State"]["Name"]
                for d in self._describe(region, [n.instance_id for n in silent])
            }
            if any(states.get(n.instance_id, "terminated") in GONE_STATES for n in silent):
                raise _Refused("NotRunning", f"nodes ended before SSH answered: {states}")
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{n.instance_id} at {n.ssh_host}:{n.ssh_port}" for n in silent)
                raise ProviderError(
                    f"EC2 nodes in {region} are running but their SSH did not answer within "
                    f"{self.aws.ready_timeout_s:.0f} s: {waiting}",
                    hint="port 22 must be reachable from this machine (security group, "
                    "aws.ssh_cidr, a public IP or a route to the private one) and the image must "
                    "start sshd; a slow image needs a larger aws.ready_timeout_s",
                )
            self._sleep(self.aws.poll_interval_s)

    # --- describe helpers -----------------------------------------------------------------------

    def _instance(self, desc: dict[str, Any], region: str) -> Instance | None:
        instance = instance_from_description(
            desc, ssh_user=self.aws.ssh_user, interface=self.aws.interface,
            connect_private=self.aws.connect_private,
        )  # fmt: skip
        if instance is not None:
            instance = replace(instance, region=region)
        if instance is not None and self._local_cloud():
            # The hosts of a cloud on this machine (moto, `orch sandbox aws`) share its
            # software: their `shutdown` would stop this machine, not an instance.
            instance = replace(instance, poweroff_command=LOCAL_CLOUD_POWEROFF)
        return instance

    def _guard_terms(self, request: LaunchRequest, offer: Offer) -> str | None:
        """The terms of the guard cloud-init arms on a node of this launch (None: no guard)."""
        if request.guard is None:
            return None
        return request.guard.for_node(
            now=datetime.now(UTC),
            hourly_usd=offer.price_per_hour * request.count,
            poweroff=LOCAL_CLOUD_GUARD_POWEROFF if self._local_cloud() else AWS_POWEROFF,
            user=self.aws.ssh_user,
        )

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
        except (OrchError, _Refused):
            raise
        # ResponseParserError: an answer that is not EC2's (an HTML error page); botocore does
        # not count it among its own errors
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise ProviderError(
                f"AWS failed to {what}: {exc}",
                hint="check credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID) and the region",
            ) from exc
