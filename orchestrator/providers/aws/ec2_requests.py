"""Pure parts of the AWS provider: tags, idempotency tokens, host keys, cloud-init user data, the
exact `run_instances` arguments, error classes, and reading instances back from descriptions.

Host key pinning: EC2 never reports an instance's SSH host key (only in the console output, late
and unauthenticated). So the provider generates an ed25519 host key pair per node here, hands
the private half to cloud-init in the user data (`ssh_keys`, with `ssh_deletekeys: true` and no
other key types generated, so the node presents exactly that key), and reports the public half
as `Instance.host_key` (it is also tagged on the instance as `orch-host-key`, so `list_owned` can
report it after a controller restart). Anyone allowed `ec2:DescribeInstanceAttribute` on the
account can read user data, hence the host private key: the pin protects against the network,
not against the account's own administrators.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.backoff import backoff_s
from orchestrator.errors import ConfigError
from orchestrator.node.guard_protocol import cloud_init_parts
from orchestrator.providers.aws import container_runtime
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.offers import Offer

TAG_JOB = "orch-job"
TAG_CLUSTER = "orch-cluster"
TAG_RANK = "orch-node-rank"
TAG_OWNER = "orch-owner"  # the login name (or `aws.owner`): a label, not ownership
TAG_LEDGER = "orch-ledger"  # id of the ledger that launched the node: only it ends the node
TAG_HOST_KEY = "orch-host-key"  # the node's public ed25519 host key line
TAG_PRICE = "orch-price"  # USD per hour at launch (the offer's price)
TAG_MARKET = "orch-market"
TAG_TOKEN = "orch-launch-token"  # the ClientToken of the call that launched it

# Refusals that mean "not here, not now": try the next zone, then the next type.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "Unsupported",
    }
)
# Answers to RunInstances that mean "try the same call again later" (with backoff): throttling,
# and server errors that are not a capacity refusal (EC2 sends InsufficientInstanceCapacity
# with HTTP 500 too, which a plain 5xx rule would retry instead of moving on).
THROTTLING_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "EC2ThrottledException",
    }
)
SERVER_ERROR_CODES = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout"}
)
# States after which a node no longer runs (nor bills for compute).
GONE_STATES = frozenset({"shutting-down", "terminated"})
LIVE_STATES = ("pending", "running", "stopping", "stopped")  # what list_owned reports
SPOT_RECLAIM_CODE = "Server.SpotInstanceTermination"
SELF_SHUTDOWN_CODE = "Client.InstanceInitiatedShutdown"  # the node ran `shutdown` itself
# Instance metadata: IMDSv2 only (a GET without a session token is refused, so a server-side
# request forgery on a node cannot read the instance profile's credentials), and a hop limit of
# 2 so that a container started by the job's `setup` on the node still gets a token, as AWS
# sets it for its own IMDSv2-only images.
IMDS_HOP_LIMIT = 2
ROOT_VOLUME_TYPE = "gp3"


@dataclass(frozen=True)
class HostKey:
    """An ed25519 host key pair for one node."""

    private_openssh: str  # "-----BEGIN OPENSSH PRIVATE KEY-----..." (unencrypted)
    public_line: str  # "ssh-ed25519 AAAA..."


def new_host_key() -> HostKey:
    """A fresh ed25519 host key pair (cryptography; no files written)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return HostKey(private_openssh=private, public_line=public)


def user_data(
    public_key: str,
    host_key: HostKey,
    guard_terms: str | None = None,
    *,
    container_gpu: bool | None = None,
) -> str:
    """cloud-config that authorizes `public_key` for the default user and installs `host_key`;
    with `guard_terms` (the document of `GuardTerms.for_node`), it also arms the node's guard
    at boot as a systemd unit (`orchestrator.node.guard_protocol.cloud_init_parts`). With
    `container_gpu` set (a job with a container), it then installs what the node lacks to run
    the job's image (`container_runtime.setup_parts`; True: a GPU node, the NVIDIA toolkit too).

    JSON is valid YAML, so the document is `#cloud-config` + JSON (no YAML quoting pitfalls).
    """
    doc: dict[str, Any] = {
        "ssh_authorized_keys": [public_key.strip()],
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {
            "ed25519_private": host_key.private_openssh,
            "ed25519_public": host_key.public_line,
        },
    }
    parts = [cloud_init_parts(guard_terms)] if guard_terms is not None else []
    if container_gpu is not None:  # after the guard: its arming never waits for an install
        parts.append(container_runtime.setup_parts(gpu=container_gpu))
    for part in parts:
        for key, entries in part.items():
            doc[key] = [*doc.get(key, []), *entries]
    return "#cloud-config\n" + json.dumps(doc, indent=1) + "\n"


USER_DATA_LIMIT = 16384  # bytes of user data EC2 takes, as sent (before its base64)


def packed(user_data_text: str) -> bytes:
    """The user data as `run_instances` sends it: gzipped, which cloud-init recognizes by its
    magic bytes and unpacks. EC2 counts the packed bytes against `USER_DATA_LIMIT`: the
    guard's program takes a third of it this way, against all of it as text."""
    return gzip.compress(user_data_text.encode(), 9, mtime=0)


def client_token(request: LaunchRequest, rank: int, offer: Offer) -> str:
    """The idempotency token of one node's `run_instances` call (<= 64 ASCII characters).

    Derived from ledger, job, cluster, attempt and rank, and from the offer (type, zone,
    market): a retried call for the same node in the same place returns the node already
    launched; another zone or type is another request, a new attempt always launches new nodes,
    and another ledger's job of the same name never adopts this one's node.
    """
    parts = (
        *((request.ledger_id,) if request.ledger_id is not None else ()),
        request.job_id,
        request.cluster,
        str(request.attempt),
        str(rank),
        offer.instance_type,
        offer.zone,
        offer.market,
    )
    return "orch-" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:48]


def node_tags(
    request: LaunchRequest, rank: int, offer: Offer, *, owner: str, host_key: str, token: str
) -> dict[str, str]:
    """Tags of one node (its instance and its volumes); `orch-ledger` when the request names
    its ledger."""
    tags = {
        TAG_JOB: request.job_id,
        TAG_CLUSTER: request.cluster,
        TAG_RANK: str(rank),
        TAG_OWNER: owner,
        TAG_HOST_KEY: host_key,
        TAG_PRICE: str(offer.price_per_hour),
        TAG_MARKET: offer.market,
        TAG_TOKEN: token,
        "Name": f"orch-{request.cluster}-{rank}",
    }
    if request.ledger_id is not None:
        tags[TAG_LEDGER] = request.ledger_id
    return tags


def metadata_options() -> dict[str, Any]:
    """`MetadataOptions` of every node: endpoint on, session tokens required (IMDSv2). Pure."""
    return {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": IMDS_HOP_LIMIT,
    }


def root_volume_mapping(root_device_name: str, disk_size_gb: int | None) -> list[dict[str, Any]]:
    """`BlockDeviceMappings` for the image's root device: encrypted (the account's default
    EBS key), gp3, deleted with the node; `disk_size_gb` None keeps the image's own size. Pure.
    """
    ebs: dict[str, Any] = {
        "Encrypted": True,
        "VolumeType": ROOT_VOLUME_TYPE,
        "DeleteOnTermination": True,
    }
    if disk_size_gb is not None:
        ebs["VolumeSize"] = disk_size_gb
    return [{"DeviceName": root_device_name, "Ebs": ebs}]


def run_instances_args(
    offer: Offer,
    *,
    image_id: str,
    subnet_id: str,
    security_group_ids: list[str],
    key_name: str | None,
    tags: dict[str, str],
    token: str,
    user_data_text: str,
    max_price: Decimal | None,
    root_device_name: str,
    disk_size_gb: int | None = None,
    instance_profile: str | None = None,
) -> dict[str, Any]:
    """The exact keyword arguments of one node's `run_instances` call. Pure.

    `instance_profile` (a name or an ARN) gives the node credentials of its own, for the
    job's checkpoint store. Every node requires IMDSv2 (`metadata_options`); its root volume
    (the image's `root_device_name`, as DescribeImages reports it) is encrypted, gp3, of
    `disk_size_gb` GB (None: the image's size) and deleted with it (`root_volume_mapping`)."""
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    args: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": offer.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": token,
        "UserData": packed(user_data_text),
        "SubnetId": subnet_id,
        "SecurityGroupIds": list(security_group_ids),
        "Placement": {"AvailabilityZone": offer.zone},
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tag_list},
            {"ResourceType": "volume", "Tags": tag_list},
        ],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": metadata_options(),
        "BlockDeviceMappings": root_volume_mapping(root_device_name, disk_size_gb),
    }
    if key_name:
        args["KeyName"] = key_name
    if instance_profile:
        key = "Arn" if instance_profile.startswith("arn:") else "Name"
        args["IamInstanceProfile"] = {key: instance_profile}
    if offer.market == "spot":
        spot: dict[str, Any] = {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        }
        if max_price is not None:
            spot["MaxPrice"] = str(max_price)
        args["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return args


def tags_of(description: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in description.get("Tags") or []}


def instance_from_description(
    desc: dict[str, Any],
    *,
    ssh_user: str,
    interface: str,
    connect_private: bool = False,
    gpu_types: Collection[str] = (),
) -> Instance | None:
    """The `Instance` an EC2 description stands for; None when it carries no orch-job tag.

    Its `container_runtime` is Docker (`container_runtime.ec2_runtime`), with every GPU on an
    instance type of `gpu_types` (the catalog's).

    `ssh_host` is the public IP when there is one (and not `connect_private`), else the
    private IP. Price and host key come
    from the tags written at launch (0 and "" when missing, e.g. on an instance orch did not
    launch but that carries an orch-job tag).
    """
    tags = tags_of(desc)
    if TAG_JOB not in tags:
        return None
    private_ip = desc.get("PrivateIpAddress") or ""
    public_ip = desc.get("PublicIpAddress") or ""
    market = tags.get(TAG_MARKET) or (
        "spot" if desc.get("InstanceLifecycle") == "spot" else "on-demand"
    )
    try:
        price = Decimal(tags.get(TAG_PRICE, "0"))
    except InvalidOperation:
        price = Decimal(0)
    try:
        rank = int(tags.get(TAG_RANK, "0"))
    except ValueError:
        rank = 0
    launched = desc.get("LaunchTime")
    launched_at = launched.astimezone(UTC) if isinstance(launched, datetime) else datetime.now(UTC)
    return Instance(
        instance_id=desc["InstanceId"],
        job_id=tags[TAG_JOB],
        cluster=tags.get(TAG_CLUSTER, tags[TAG_JOB]),
        rank=rank,
        private_ip=private_ip,
        ssh_host=private_ip if connect_private and private_ip else public_ip or private_ip,
        ssh_port=22,
        ssh_user=ssh_user,
        host_key=tags.get(TAG_HOST_KEY, ""),
        interface=interface,
        market="spot" if market == "spot" else "on-demand",
        instance_type=desc.get("InstanceType", ""),
        price_per_hour=price,
        launched_at=launched_at,
        tags=tags,
        zone=(desc.get("Placement") or {}).get("AvailabilityZone"),
        credentials=bool((desc.get("IamInstanceProfile") or {}).get("Arn")),
        ledger_id=tags.get(TAG_LEDGER),
        container_runtime=container_runtime.ec2_runtime(
            gpu=desc.get("InstanceType", "") in gpu_types
        ),
    )


def launch_retryable(code: str, http_status: int | None) -> bool:
    """Whether a refused RunInstances is worth repeating as is: throttled, or a server error
    that is not a capacity refusal (those move on to the next offer at once). Pure."""
    if code in CAPACITY_CODES:
        return False
    if code in THROTTLING_CODES or code in SERVER_ERROR_CODES:
        return True
    return http_status is not None and 500 <= http_status <= 599


def launch_backoff_s(
    attempt: int, jitter: float, *, first_s: float = 1.0, cap_s: float = 20.0
) -> float:
    """Wait before repeating a RunInstances for the `attempt`-th time (1-based): exponential,
    capped, with full jitter (`jitter` in [0, 1)), as botocore's standard retry mode does."""
    return backoff_s(attempt, first_s, cap_s, jitter)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError (None for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    return None


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


@dataclass(frozen=True)
class TerraformOutputs:
    """What orch reads from `terraform output -json` of infra/ (every field optional)."""

    region: str | None = None
    key_name: str | None = None
    security_group_id: str | None = None
    subnet_ids: dict[str, str] | None = None  # zone -> subnet id
    instance_profile: str | None = None  # for nodes of jobs with a checkpoint store
    node_job_policy: str | None = None  # ARN of the policy of each job's own node role


def read_tf_outputs(path: Path) -> TerraformOutputs:
    """Parse a `terraform output -json` file; plain {name: value} files are accepted too."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read Terraform outputs {path}: {exc}",
            hint="run `terraform output -json > FILE` in infra/, or unset ORCH_AWS_TF_OUTPUTS",
        ) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"Terraform outputs {path} must hold a JSON object")
    values = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in raw.items()}
    subnets = values.get("subnet_ids")
    if subnets is not None and not isinstance(subnets, dict):
        raise ConfigError(f"Terraform output subnet_ids in {path} must map zone -> subnet id")
    return TerraformOutputs(
        region=values.get("region"),
        key_name=values.get("key_name"),
        security_group_id=values.get("security_group_id"),
        subnet_ids={str(k): str(v) for k, v in subnets.items()} if subnets else None,
        instance_profile=values.get("instance_profile") or None,
        node_job_policy=values.get("node_job_policy") or None,
    )


_TRANSITION_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def transition_time(reason: str) -> datetime | None:
    """The UTC time in an EC2 `StateTransitionReason` ("User initiated (2026-12-02 04:00:00
    GMT)"; "... UTC)" from moto, which the sandbox runs), or None when it states none."""
    found = _TRANSITION_TIME.search(reason)
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
