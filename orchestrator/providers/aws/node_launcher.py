"""Starting the nodes of one launch on EC2: `AwsProvider.launch` ranks the offers, this tries them.

`NodeLauncher.launch(request, offers)` tries the offers in `offers.launch_order`. On one offer it
starts every node in that ONE zone, one RunInstances call per node (each node with its own host
key and rank tag), then waits until all are `running` and then until each answers with an SSH
banner on its ssh_host:ssh_port (EC2 says `running` before sshd listens; not waited for with
`aws.wait_for_ssh` off), both within `aws.ready_timeout_s` once the nodes are started. A refusal
(`Refused`: a capacity code of `launch.CAPACITY_CODES`, no subnet in the offer's zone, a node
gone while starting) moves on to the next offer at once; when every offer is refused,
`CapacityError` lists them. Any other failure is a `ProviderError` (or `ConfigError`).

Billing: a node is billed from its `LaunchTime` (`Instance.launched_at`) at the offer's price.
Whatever ends the try of an offer (a refusal, an error, a timeout, an interrupt), the nodes it
started, and any instance carrying one of its nodes' launch tokens, are terminated
(`AwsProvider.terminate`: their billing stops when it returns) before the error goes on, so no
node of a failed launch is left running.

Idempotency: each node's call carries a ClientToken derived from job, cluster, attempt, rank and
offer, and the node is tagged with it; before launching, a live instance with that tag is adopted
instead, so a retried launch (same request) never starts a node twice. Every call with one token
sends the same parameters, host key and user data included (EC2 refuses a token reused with
others). RunInstances goes through `AwsProvider.launch_client`, which makes one try per call:
EC2 refuses capacity with HTTP 500, which botocore would retry for half a minute before orch
could try the next zone. Throttled and other 5xx answers, and calls that got no answer, are
repeated here (exponential backoff, at most `aws.max_api_attempts` tries, looking for the node by
its token before each repeat), while a capacity code moves on at once.

`NodeLauncher.wait` and `wait_ssh` also serve `AwsProvider.terminate` and the controller host's
launch (`host_node`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.parsers import ResponseParserError

from orchestrator.errors import CapacityError, ConfigError, ProviderError
from orchestrator.node.guard_protocol import AWS_POWEROFF
from orchestrator.node.spot_notice import DEFAULT_METADATA_URL
from orchestrator.providers.aws import cluster_network, node_roles
from orchestrator.providers.aws import network as aws_network
from orchestrator.providers.aws.ec2_requests import (
    CAPACITY_CODES,
    GONE_STATES,
    LIVE_STATES,
    TAG_TOKEN,
    HostKey,
    client_token,
    error_code,
    http_status,
    launch_backoff_s,
    launch_retryable,
    new_host_key,
    node_tags,
    run_instances_args,
    user_data,
)
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.offers import Offer, launch_order
from orchestrator.providers.ssh_banner import answers_ssh

if TYPE_CHECKING:
    from orchestrator.providers.aws.provider import AwsProvider

# The dead-man switch's poweroff on nodes of a cloud running on this machine. A cloud on this
# machine (`orch sandbox aws`) gives its hosts a `shutdown` of their own at this path, which ends
# the instance; a guard where there is none says it cannot power off.
LOCAL_CLOUD_GUARD_POWEROFF = "/usr/local/sbin/shutdown -h now"
# A cluster's group deleted between its lookup and the launch (swept as a leak while the
# cluster had no node): the next offer looks it up again, and makes it anew.
GROUP_GONE = "InvalidGroup.NotFound"


@dataclass(frozen=True)
class Attempt:
    """One offer tried by `NodeLauncher.launch`, and why it was refused."""

    offer: Offer
    code: str  # AWS error code, or "NoSubnet" / "NotRunning"
    message: str

    def line(self) -> str:
        o = self.offer
        return f"{o.instance_type} {o.market} in {o.zone} at ${o.price_per_hour}/h: {self.code}"


@dataclass(frozen=True)
class Where:
    """Where one offer's nodes go, besides the network: subnet, groups, credentials."""

    subnet: str  # the offer's zone's subnet
    groups: list[str]  # the network's groups and the cluster's own
    profile: str | None  # instance profile (None: no credentials, a job without a store)


def needs_role(request: LaunchRequest) -> bool:
    """Whether the nodes of `request` need AWS credentials of their own: to write the job's
    checkpoint store, to log in to Amazon ECR for its container image, or to read its bucket
    data and write its outputs (never the user's own keys copied to a cloud machine). Pure."""
    return bool(request.store) or request.ecr_login or request.buckets


class Refused(Exception):
    """An offer that cannot take the launch now (capacity, no subnet, nodes gone while starting):
    the next offer is tried."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NodeLauncher:
    """The launching half of an `AwsProvider`: its EC2 clients, descriptions and `terminate` are
    the provider's; the host keys, user data and networks of its launches are kept here."""

    def __init__(self, provider: AwsProvider, *, sleep: Callable[[float], None]) -> None:
        self.provider = provider
        self.aws = provider.aws
        self._sleep = sleep
        # per ClientToken: a repeated call must send the same parameters (EC2 refuses a token
        # reused with others: IdempotentParameterMismatch), host key included
        self._host_keys: dict[str, HostKey] = {}
        self._user_data: dict[str, str] = {}  # by launch token
        self._networks: dict[tuple[object, ...], aws_network.Network] = {}
        self._swept: set[str] = set()  # regions whose leaked cluster groups were swept
        self._swept_profiles: set[str] = set()  # per-job policies whose leaked roles were swept

    def launch(self, request: LaunchRequest, offers: list[Offer]) -> list[Instance]:
        """All nodes of `request` on the first of `offers` (in `launch_order`) that takes them,
        ordered by rank; `CapacityError` listing every offer tried when each was refused."""
        tried: list[Attempt] = []
        for offer in launch_order(offers, request):
            try:
                return self._launch_offer(request, offer)
            except Refused as refused:
                tried.append(Attempt(offer, refused.code, refused.message))
        raise CapacityError(
            "no AWS capacity for the job; tried:\n    " + "\n    ".join(a.line() for a in tried),
            hint="retry later, allow on-demand (spot: auto), or another accelerator or region",
        )

    def job_policy(self) -> str | None:
        """The ARN of infra/'s per-job node policy (`node_roles`); None: not configured."""
        return self.aws.node_job_policy or aws_network.tf_outputs(self.aws).node_job_policy

    def own_role(self, request: LaunchRequest) -> bool:
        """Whether the nodes of `request` get a role of their own (`node_roles`): a job that
        needs credentials (`needs_role`), not a kept cluster's (whose later jobs are not known
        yet), with the per-job policy configured."""
        kept = request.guard is not None and request.guard.autostop
        return needs_role(request) and not kept and self.job_policy() is not None

    def check_credentials(self, request: LaunchRequest) -> None:
        """`ConfigError` before anything launches when the nodes of `request` need the shared
        instance profile and none is configured."""
        if needs_role(request) and not self.own_role(request):
            self.instance_profile(request)

    def _node_profile(self, request: LaunchRequest) -> str | None:
        """The instance profile of the nodes of `request`: the job's own, made when missing;
        the shared one; None for a job that needs none (`needs_role`)."""
        if not needs_role(request):
            return None
        policy = self.job_policy()
        if not self.own_role(request) or policy is None:
            return self.instance_profile(request)
        if policy not in self._swept_profiles:
            self._swept_profiles.add(policy)
            self.provider.sweep_job_profiles()
        return str(self.provider._api(
            f"make the credentials of job {request.job_id}'s nodes",
            lambda: node_roles.ensure_job_profile(
                self.provider.iam_client(), job_id=request.job_id, ledger_id=request.ledger_id,
                owner=self.provider.owner, policy_arn=policy,
            ),
        ))  # fmt: skip

    def instance_profile(self, request: LaunchRequest | None = None) -> str:
        """The shared instance profile that lets nodes write the checkpoint store and pull
        images from Amazon ECR."""
        profile = self.aws.instance_profile or aws_network.tf_outputs(self.aws).instance_profile
        if not profile:
            if request is not None and request.ecr_login and not request.store:
                raise ConfigError(
                    "the job's container.image is in Amazon ECR and has no "
                    "container.credentials: its nodes log in with their instance role, and no "
                    "instance profile is configured",
                    hint="apply infra/ with checkpoint_store set (its `node_job_policy` and "
                    "`instance_profile` outputs: their roles may pull from ECR), or set "
                    "aws.instance_profile (ORCH_AWS_INSTANCE_PROFILE) to a profile whose role "
                    "may, or give container.credentials (username, password_secret)",
                )
            if request is not None and request.buckets and not request.store:
                raise ConfigError(
                    "the job reads s3:// data or writes outputs to a bucket, which its nodes do "
                    "with an instance role of their own, and no instance profile is configured",
                    hint="apply infra/ with checkpoint_store, data_sources and "
                    "output_destinations set (infra/README.md), or set aws.instance_profile "
                    "(ORCH_AWS_INSTANCE_PROFILE) to a profile whose role may read and write them",
                )
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
            self._networks[key] = self.provider._api(
                f"prepare the network in {region}",
                lambda: aws_network.resolve_network(
                    self.provider.client(region),
                    region,
                    self.aws,
                    request.public_key,
                    owner=self.provider.owner,
                    image=request.image,
                    ports=request.ports,
                ),
            )
        return self._networks[key]

    def _launch_offer(self, request: LaunchRequest, offer: Offer) -> list[Instance]:
        """All nodes on `offer`, or `Refused` (capacity) with none of them left running."""
        provider = self.provider
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
            raise Refused("NoSubnet", f"no subnet configured in {offer.zone}")
        where = Where(subnet, self._groups(request, offer.region, network),
                      self._node_profile(request))  # fmt: skip
        ids: list[str] = []
        try:
            for rank in request.node_ranks:
                ids.append(self._launch_node(request, rank, offer, network, where))
            deadline = time.monotonic() + self.aws.ready_timeout_s
            self.wait(offer.region, ids, frozenset({"running"}), "running", deadline=deadline)
            by_id = {d["InstanceId"]: d for d in provider._describe(offer.region, ids)}
            nodes = [
                n
                for n in (provider._instance(by_id[i], offer.region) for i in ids)
                if n is not None
            ]
            if self.aws.wait_for_ssh:
                self.wait_ssh(offer.region, nodes, deadline)
            return nodes
        except BaseException as exc:
            tokens = [client_token(request, rank, offer) for rank in request.node_ranks]
            try:
                # A RunInstances whose answer was lost on its last try started a node whose id
                # orch never heard: its token tag finds it.
                ids = list(dict.fromkeys(ids + self._launched_with(offer.region, tokens)))
                # the cluster's group and role stay: the next offer uses them at once
                provider.terminate(ids, keep_cluster=True)
            except Exception as cleanup:
                exc.add_note(
                    f"terminating the partial launch {ids or tokens} failed too: {cleanup}"
                )
            raise

    def _groups(
        self, request: LaunchRequest, region: str, network: aws_network.Network
    ) -> list[str]:
        """The network's groups and the cluster's own (`cluster_network`), made when missing;
        looked up for every offer tried, so a group swept meanwhile is made again. The first
        launch in a region also sweeps this owner's leaked cluster groups."""
        ec2 = self.provider.client(region)
        if region not in self._swept:
            self._swept.add(region)
            self.provider.sweep_groups(region)
        vpc_id = network.vpc_id
        if vpc_id is None:
            return network.security_group_ids
        group = self.provider._api(
            f"prepare the security group of cluster {request.cluster}",
            lambda: cluster_network.ensure_cluster_group(
                ec2, vpc_id, request.cluster, owner=self.provider.owner,
                ledger_id=request.ledger_id,
            ),
        )  # fmt: skip
        return [*network.security_group_ids, group]

    def _launched_with(self, region: str, tokens: list[str]) -> list[str]:
        """Ids of the live instances launched by calls with these ClientTokens (their tag)."""
        if not tokens:
            return []
        found = self.provider._describe_filtered(
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
        where: Where,
    ) -> str:
        """Start one node (or find it started by an earlier try of the same request). A new
        job profile EC2 does not see yet is waited for, `node_roles.PROFILE_READY_S` at most."""
        token = client_token(request, rank, offer)
        tries = 0
        started = time.monotonic()
        while True:
            adopted = self.provider._describe_filtered(
                offer.region,
                [
                    {"Name": f"tag:{TAG_TOKEN}", "Values": [token]},
                    {"Name": "instance-state-name", "Values": ["pending", "running"]},
                ],
            )
            if adopted:  # a retried launch: that node already exists
                return adopted[0]["InstanceId"]
            tries += 1
            try:
                launched = self._run_instances(request, rank, offer, network, where, token, tries)
            except ClientError as exc:  # only a profile EC2 does not see yet comes here
                if time.monotonic() - started > node_roles.PROFILE_READY_S:
                    raise ProviderError(
                        f"EC2 did not accept the instance profile {where.profile} within "
                        f"{node_roles.PROFILE_READY_S:.0f} s: {exc}",
                        hint="retry the launch; IAM takes a while to show a new profile to EC2",
                    ) from exc
                tries -= 1  # not a failed try: IAM is eventually consistent
                self._sleep(node_roles.PROFILE_RETRY_S)
                continue
            if launched is not None:
                return launched
            self._sleep(launch_backoff_s(tries, random.random()))

    def _run_instances(
        self,
        request: LaunchRequest,
        rank: int,
        offer: Offer,
        network: aws_network.Network,
        where: Where,
        token: str,
        tries: int,
    ) -> str | None:
        """One RunInstances call: the new instance's id, or None when the call may be repeated
        (throttled, a 5xx other than capacity, no answer) and `tries` < `aws.max_api_attempts`.
        Capacity refusals raise `Refused` at once; a job profile EC2 does not see yet the
        `ClientError` itself; anything else `ProviderError`."""
        if token not in self._host_keys:
            self._host_keys[token] = new_host_key()
            # The same text on every try: EC2 refuses a repeated token with other parameters.
            self._user_data[token] = user_data(
                request.public_key,
                self._host_keys[token],
                self._guard_terms(request, offer),
                container_gpu=self._container_gpu(request, offer),
            )
        host_key = self._host_keys[token]
        args = run_instances_args(
            offer,
            image_id=network.image_id,
            subnet_id=where.subnet,
            security_group_ids=where.groups,
            key_name=network.key_name,
            tags=node_tags(
                request,
                rank,
                offer,
                owner=self.provider.owner,
                host_key=host_key.public_line,
                token=token,
            ),
            token=token,
            user_data_text=self._user_data[token],
            max_price=request.max_price_per_hour if offer.market == "spot" else None,
            instance_profile=where.profile,
            root_device_name=network.root_device_name,
            # the image's own size unless the spec asks for more: the size its root mapping
            # gives, which is what EC2 takes when none is sent (None: EC2's choice)
            disk_size_gb=request.disk_size_gb or network.root_volume_gb,
        )
        repeat = tries < self.aws.max_api_attempts
        try:
            reply = self.provider.launch_client(offer.region).run_instances(**args)
        except ClientError as exc:
            code = error_code(exc)
            if code in CAPACITY_CODES or code == GROUP_GONE:
                raise Refused(code, str(exc)) from exc
            if node_roles.is_job_profile(where.profile) and node_roles.profile_not_ready(exc):
                raise  # `_launch_node` waits for IAM
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

    def _container_gpu(self, request: LaunchRequest, offer: Offer) -> bool | None:
        """For a job with a container, whether its nodes are GPU nodes (their boot setup
        installs the NVIDIA toolkit too); None: no boot setup, for a job without one or on a
        cloud on this machine (moto, `orch sandbox aws`), whose hosts are this machine and
        must never install packages on it."""
        if not request.container or aws_network.is_local_endpoint(self.aws.endpoint_url):
            return None
        return offer.instance_type in self.provider.gpu_types()

    def _guard_terms(self, request: LaunchRequest, offer: Offer) -> str | None:
        """The terms of the guard cloud-init arms on a node of this launch (None: no guard)."""
        if request.guard is None:
            return None
        local = aws_network.is_local_endpoint(self.aws.endpoint_url)
        return request.guard.for_node(
            now=datetime.now(UTC),
            hourly_usd=offer.price_per_hour * request.count,
            poweroff=LOCAL_CLOUD_GUARD_POWEROFF if local else AWS_POWEROFF,
            user=self.aws.ssh_user,
            metadata_url=DEFAULT_METADATA_URL,
        )

    # --- waiting for EC2 ------------------------------------------------------------------------

    def wait(
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
            states = {
                d["InstanceId"]: d["State"]["Name"] for d in self.provider._describe(region, ids)
            }
            if all(states.get(i) in wanted for i in ids):
                return
            if "running" in wanted and any(states.get(i, "terminated") in GONE_STATES for i in ids):
                raise Refused("NotRunning", f"nodes ended while starting: {states}")
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"EC2 nodes in {region} not {label} after {self.aws.ready_timeout_s:.0f} s:"
                    f" {states}"
                )
            self._sleep(self.aws.poll_interval_s)

    def wait_ssh(self, region: str, nodes: list[Instance], deadline: float) -> None:
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
                for d in self.provider._describe(region, [n.instance_id for n in silent])
            }
            if any(states.get(n.instance_id, "terminated") in GONE_STATES for n in silent):
                raise Refused("NotRunning", f"nodes ended before SSH answered: {states}")
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
