"""One small on-demand EC2 instance for the controller host (`orch controller up --provider aws`).

The host is no job's node: it carries no `orch-job` tag, so `list_owned`, `orch reconcile` and
`orch down --all` never see it; it is tagged `orch-role` (the caller's role name), `orch-owner`,
its host key, price and launch token. It gets the controller host's instance profile: its own
orch reaches EC2 with the credentials of its metadata endpoint, never with the user's keys.

Lifecycle: `launch_host` -> the returned `Instance` (billing starts at its `launched_at`, at
`price_per_hour`) -> `AwsProvider.terminate([id])` (billing stops when it returns). A host that
powers itself off ends (EC2 terminates it on shutdown): `AwsProvider.self_ended` says when.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from orchestrator.errors import ConfigError, ProviderError
from orchestrator.providers.aws import network as aws_network
from orchestrator.providers.aws.catalog import Catalog
from orchestrator.providers.aws.container_runtime import ec2_runtime
from orchestrator.providers.aws.ec2_requests import (
    CAPACITY_CODES,
    GONE_STATES,
    TAG_HOST_KEY,
    TAG_MARKET,
    TAG_OWNER,
    TAG_PRICE,
    TAG_TOKEN,
    error_code,
    new_host_key,
    run_instances_args,
    user_data,
)
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import Instance
from orchestrator.providers.offers import Offer

TAG_ROLE = "orch-role"
DEFAULT_HOST_TYPE = "t3.small"
# On-demand list prices (USD/h, Linux, us-east-1, 2025) of small general-purpose types for the
# host; the GPU catalog prices any of its own types. Recorded at launch, never re-read.
HOST_TYPE_PRICES: dict[str, Decimal] = {
    "t3.micro": Decimal("0.0104"),
    "t3.small": Decimal("0.0208"),
    "t3.medium": Decimal("0.0416"),
    "t3.large": Decimal("0.0832"),
    "m5.large": Decimal("0.096"),
}
# A zone that does not sell the type (the sandbox says `Unsupported`): try the next one.
_NEXT_ZONE = CAPACITY_CODES | {"Unsupported"}


def host_price(catalog: Catalog, instance_type: str, region: str) -> Decimal:
    """The on-demand USD/h of `instance_type` in `region`: the catalog's price for its types,
    else `HOST_TYPE_PRICES`; `ConfigError` for a type neither knows. Pure."""
    for known in catalog.types:
        if known.name == instance_type and (price := known.price_in(region)) is not None:
            return price
    if instance_type in HOST_TYPE_PRICES:
        return HOST_TYPE_PRICES[instance_type]
    raise ConfigError(
        f"--instance-type {instance_type}: orch knows no on-demand price for it in {region}",
        hint=f"use one of {', '.join(HOST_TYPE_PRICES)} (or a type of `orch catalog`)",
    )


def host_tags(
    role: str, *, owner: str, host_key: str, price: Decimal, token: str
) -> dict[str, str]:
    """The host instance's tags: a role, never `orch-job`. Pure."""
    return {
        TAG_ROLE: role,
        TAG_OWNER: owner,
        TAG_HOST_KEY: host_key,
        TAG_PRICE: str(price),
        TAG_MARKET: "on-demand",
        TAG_TOKEN: token,
        "Name": f"orch-{role}",
    }


def launch_host(
    provider: AwsProvider,
    *,
    role: str,
    public_key: str,
    instance_type: str,
    instance_profile: str,
) -> Instance:
    """Launch the host in the first region in use, trying its zones in order, and return it
    once it runs and its sshd answers (within `aws.ready_timeout_s`). `ProviderError` when no
    zone takes it or it does not come up; an instance that started is terminated before that
    is raised."""
    region = provider.regions()[0]
    price = host_price(provider.catalog, instance_type, region)
    ec2 = provider.client(region)
    net = provider._api(
        f"prepare the network in {region}",
        lambda: aws_network.resolve_network(
            ec2, region, provider.aws, public_key, owner=provider.owner
        ),
    )
    host_key = new_host_key()
    token = f"orch-{role}-{uuid.uuid4().hex[:24]}"
    refused: list[str] = []
    for zone in sorted(net.subnets):
        offer = Offer(
            instance_type=instance_type, region=region, zone=zone, market="on-demand",
            price_per_hour=price, on_demand_price=price, gpu="", gpus=0, gpu_memory_gib=0.0,
            vcpus=1, memory_gib=1.0,
        )  # fmt: skip
        args = run_instances_args(
            offer,
            image_id=net.image_id,
            subnet_id=net.subnets[zone],
            security_group_ids=net.security_group_ids,
            key_name=net.key_name,
            tags=host_tags(
                role,
                owner=provider.owner,
                host_key=host_key.public_line,
                price=price,
                token=token,
            ),  # fmt: skip
            token=f"{token}-{zone}",
            user_data_text=user_data(public_key, host_key),
            max_price=None,
            instance_profile=instance_profile,
            root_device_name=net.root_device_name,
            disk_size_gb=net.root_volume_gb,
        )
        try:
            reply = provider.launch_client(region).run_instances(**args)
        except ClientError as exc:
            if error_code(exc) in _NEXT_ZONE:
                refused.append(f"{zone}: {error_code(exc)}")
                continue
            raise ProviderError(f"EC2 refused to launch the controller host: {exc}") from exc
        except BotoCoreError as exc:
            raise ProviderError(f"EC2 could not be reached: {exc}") from exc
        instance_id = reply["Instances"][0]["InstanceId"]
        try:
            return _wait_up(provider, region, instance_id, host_key.public_line)
        except BaseException:
            provider.terminate([instance_id])
            raise
    raise ProviderError(
        f"no zone of {region} launched a {instance_type} for the controller host: "
        + "; ".join(refused),
        hint="retry later, or give another --instance-type",
    )


def _wait_up(provider: AwsProvider, region: str, instance_id: str, host_key: str) -> Instance:
    deadline = time.monotonic() + provider.aws.ready_timeout_s
    provider._launcher.wait(
        region, [instance_id], frozenset({"running"}), "running", deadline=deadline
    )
    (desc,) = provider._describe(region, [instance_id])
    node = host_instance(desc, region, ssh_user=provider.aws.ssh_user, host_key=host_key,
                         gpu_types=provider.gpu_types())  # fmt: skip
    provider._launcher.wait_ssh(region, [node], deadline)
    return node


def host_instance(
    desc: dict[str, Any],
    region: str,
    *,
    ssh_user: str,
    host_key: str,
    gpu_types: Collection[str] = (),
) -> Instance:
    """The host as an `Instance`, from EC2's description (Docker as its container runtime,
    every GPU on a type of `gpu_types`, as on a node). Pure."""
    tags = {t["Key"]: t["Value"] for t in desc.get("Tags") or []}
    launched = desc.get("LaunchTime")
    private_ip = desc.get("PrivateIpAddress") or ""
    return Instance(
        instance_id=desc["InstanceId"],
        job_id=tags.get(TAG_ROLE, ""),
        cluster=tags.get(TAG_ROLE, ""),
        rank=0,
        private_ip=private_ip,
        ssh_host=desc.get("PublicIpAddress") or private_ip,
        ssh_port=22,
        ssh_user=ssh_user,
        host_key=host_key,
        interface="",
        market="on-demand",
        instance_type=desc.get("InstanceType", ""),
        price_per_hour=Decimal(tags.get(TAG_PRICE, "0")),
        launched_at=launched.astimezone(UTC)
        if isinstance(launched, datetime)
        else datetime.now(UTC),
        tags=tags,
        zone=(desc.get("Placement") or {}).get("AvailabilityZone"),
        credentials=bool((desc.get("IamInstanceProfile") or {}).get("Arn")),
        region=region,
        container_runtime=ec2_runtime(gpu=desc.get("InstanceType", "") in gpu_types),
    )


def host_gone(provider: AwsProvider, instance_id: str) -> bool:
    """Whether EC2 no longer runs the host (shutting down, terminated, or unknown)."""
    for region in provider.regions():
        for desc in provider._describe(region, [instance_id]):
            return desc["State"]["Name"] in GONE_STATES
    return True
