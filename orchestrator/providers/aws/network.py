"""Where AWS nodes go: key pair, security group, subnet per zone, and the image, per region.

Taken, in order, from the settings (`aws.key_name`, `aws.security_group_id`, `aws.subnet_ids`,
`aws.ami_id`), from the Terraform outputs file of infra/ (`aws.tf_outputs`), or else found or
created in the region's default VPC: a key pair named after the cluster key's fingerprint
(imported from `LaunchRequest.public_key`), a security group `orch` (SSH only: from each
owner's `aws.ssh_cidr`, one rule per owner that no other owner's launch revokes, and between
its members; see `ssh_rules`) and the default subnet of each zone. A job with `resources.ports`
also joins a group that opens just those ports to the same address as SSH
(`ensure_ports_group`). Created key pairs and these groups are left in place for the next
launch (they cost nothing). The nodes of one cluster reach each other on other ports through
their cluster's own group (`cluster_network`), made and deleted with the cluster.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from orchestrator.config import AwsSettings
from orchestrator.errors import ConfigError, ProviderError
from orchestrator.providers.aws.ec2_requests import (
    TerraformOutputs,
    error_code,
    read_tf_outputs,
)
from orchestrator.providers.aws.ssh_rules import ingress_plan, singles
from orchestrator.spec.placement import port_range

SECURITY_GROUP_NAME = "orch"
CLUSTER_GROUP_PREFIX = "orch-cluster-"  # the groups of `cluster_network`, one per cluster


@dataclass(frozen=True)
class Network:
    """Ids to launch with in one region."""

    region: str
    image_id: str
    key_name: str | None
    security_group_id: str
    subnets: dict[str, str]  # zone -> subnet id; a zone not listed cannot be used
    root_device_name: str  # the image's root device (DescribeImages: RootDeviceName)
    root_volume_gb: int | None = None  # size of the image's root snapshot (None: unknown)
    ports_group_id: str | None = None  # the job's ports, open to this machine (None: no ports)
    vpc_id: str | None = None  # the VPC of the groups (where a cluster's own group is made)

    @property
    def security_group_ids(self) -> list[str]:
        """The groups every node of a launch joins."""
        return [self.security_group_id] + ([self.ports_group_id] if self.ports_group_id else [])


def tf_outputs(settings: AwsSettings) -> TerraformOutputs:
    """The Terraform outputs named by the settings, or empty ones."""
    return read_tf_outputs(settings.tf_outputs) if settings.tf_outputs else TerraformOutputs()


def regions(settings: AwsSettings) -> list[str]:
    """Regions to use: the Terraform outputs' region when it names one, else `aws.regions`."""
    region = tf_outputs(settings).region
    return [region] if region else list(settings.regions)


def resolve_network(
    ec2: Any,
    region: str,
    settings: AwsSettings,
    public_key: str,
    *,
    owner: str,
    image: str | None = None,
    ports: tuple[str, ...] = (),
) -> Network:
    """Find (or create) everything a launch in `region` needs. Does I/O; idempotent.

    `owner` (the `orch-owner` label) owns the SSH rule a launch adds to the default VPC's `orch`
    group. `image` (the spec's: an AMI id, or a name pattern whose newest match is taken)
    replaces `aws.ami_id` / `aws.ami_name`; `ports` get a group of their own
    (`ensure_ports_group`)."""
    tf = tf_outputs(settings)
    key_name = settings.key_name or tf.key_name or ensure_key_pair(ec2, public_key)
    group = settings.security_group_id or tf.security_group_id
    subnets = dict(settings.subnet_ids or tf.subnet_ids or {})
    vpc_id: str | None = None
    if group is None or not subnets:
        vpc = default_vpc(ec2, region)
        if group is None:
            vpc_id = vpc["VpcId"]
            cidr = ssh_cidr(settings, vpc["CidrBlock"])
            group = ensure_security_group(ec2, vpc_id, cidr, owner=owner)
        subnets = subnets or default_subnets(ec2, vpc["VpcId"])
    if vpc_id is None:
        vpc_id = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"][0]["VpcId"]
    if image is not None:
        by_id = image.startswith("ami-")
        override = {"ami_id": image} if by_id else {"ami_id": None, "ami_name": image}
        settings = settings.model_copy(update=override)
    found = describe_image(ec2, region, settings.ami_id) if settings.ami_id else None
    found = found or find_image(ec2, region, settings)
    ports_group = None
    if ports:
        vpc_cidr = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlock"]
        ports_group = ensure_ports_group(ec2, vpc_id, ssh_cidr(settings, vpc_cidr), ports)
    return Network(
        region=region,
        image_id=found["ImageId"],
        key_name=key_name,
        security_group_id=group,
        subnets=subnets,
        root_device_name=root_device_name(found),
        root_volume_gb=root_volume_gb(found),
        ports_group_id=ports_group,
        vpc_id=vpc_id,
    )


def ensure_key_pair(ec2: Any, public_key: str) -> str:
    """Import `public_key` as a key pair named after its hash unless it exists; return the name."""
    name = "orch-" + hashlib.sha256(public_key.strip().encode()).hexdigest()[:16]
    try:
        ec2.describe_key_pairs(KeyNames=[name])
        return name
    except ClientError as exc:
        if error_code(exc) != "InvalidKeyPair.NotFound":
            raise
    try:
        ec2.import_key_pair(KeyName=name, PublicKeyMaterial=public_key.strip().encode())
    except ClientError as exc:
        if error_code(exc) != "InvalidKeyPair.Duplicate":  # created meanwhile
            raise
    return name


def is_local_endpoint(endpoint_url: str | None) -> bool:
    """Whether the EC2 endpoint is on this machine (moto, `orch sandbox aws`). Pure."""
    host = urlsplit(endpoint_url or "").hostname
    if not host:
        return False
    try:
        return host == "localhost" or ip_address(host).is_loopback
    except ValueError:
        return False


def route_source(destination: str) -> str | None:
    """The address this machine sends from toward `destination`, as its routing table says
    (a UDP socket's connect sends nothing); None when there is no route."""
    family = socket.AF_INET6 if ip_address(destination).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((destination, 22))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def ssh_cidr(settings: AwsSettings, vpc_cidr: str) -> str:
    """Who may reach the `orch` group's port 22: `aws.ssh_cidr`; unset, for a cloud on this
    machine, this machine's own address toward the VPC (/32), which is where its SSH comes
    from. A real cloud sees this machine behind whatever NAT lies between, which nothing on
    this machine can tell reliably: a `ConfigError` that says how to set it."""
    if settings.ssh_cidr:
        return settings.ssh_cidr
    if is_local_endpoint(settings.endpoint_url):
        source = route_source(str(next(ip_network(vpc_cidr).hosts())))
        if source is not None:
            return str(ip_network(source))
    raise ConfigError(
        "aws.ssh_cidr is not set: orch will not open the nodes' SSH port to the whole internet,"
        " and cannot tell your public address from this machine",
        hint="set aws.ssh_cidr (ORCH_AWS_SSH_CIDR) to your public address with /32, e.g."
        ' 203.0.113.7/32 (your router or provider shows it; so does the "My IP" source in'
        " the EC2 console's security group editor), or to your network's CIDR block",
    )


def default_vpc(ec2: Any, region: str) -> dict[str, Any]:
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise ProviderError(
            f"region {region} has no default VPC and no network was configured",
            hint="apply infra/ and set ORCH_AWS_TF_OUTPUTS to its `terraform output -json` file",
        )
    return vpcs[0]


def rules_plan(
    permissions: list[dict[str, Any]], wanted: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rules to revoke, rules to authorize) that leave a group whose ingress is `permissions`
    (DescribeSecurityGroups' `IpPermissions`) with exactly `wanted`, each of one source;
    descriptions do not count. Pure."""
    current = [rule.permission for rule in singles(permissions)]
    bare = [singles([rule])[0].permission for rule in wanted]
    revoke = [rule for rule in current if rule not in bare]
    authorize = [rule for rule, plain in zip(wanted, bare, strict=True) if plain not in current]
    return revoke, authorize


def find_group(ec2: Any, vpc_id: str, name: str) -> dict[str, Any] | None:
    """The group named `name` in VPC `vpc_id`, as DescribeSecurityGroups reports it (None:
    there is none)."""
    found = ec2.describe_security_groups(
        Filters=[
            {"Name": "group-name", "Values": [name]},
            {"Name": "vpc-id", "Values": [vpc_id]},
        ]
    )["SecurityGroups"]
    return found[0] if found else None


def _create_group(ec2: Any, vpc_id: str, name: str, description: str) -> str:
    return str(
        ec2.create_security_group(
            GroupName=name,
            Description=description,
            VpcId=vpc_id,
            TagSpecifications=[
                {
                    "ResourceType": "security-group",
                    "Tags": [{"Key": "orch-owner", "Value": "orch"}],
                }
            ],
        )["GroupId"]
    )


def _tolerant(call: Callable[..., Any], tolerated: str, **kwargs: Any) -> None:
    """`call(**kwargs)`, where the error code `tolerated` means another launch did it first."""
    try:
        call(**kwargs)
    except ClientError as exc:
        if error_code(exc) != tolerated:
            raise


def ensure_security_group(
    ec2: Any, vpc_id: str, ssh_cidr: str, *, owner: str, now: datetime | None = None
) -> str:
    """The `orch` group of the VPC (created when missing), with `owner`'s SSH rule from
    `ssh_cidr` and SSH between its members; `owner`'s stale rules and every rule that is no
    owner's are revoked, other owners' rules are left as they are (`ssh_rules`). Each rule is
    changed by a call of its own, so two launches at once never undo each other: a rule
    already revoked or added by the other is no error. A group of one's own is
    `aws.security_group_id`, left as it is."""
    found = find_group(ec2, vpc_id, SECURITY_GROUP_NAME)
    if found is None:
        group_id = _create_group(ec2, vpc_id, SECURITY_GROUP_NAME, "orch nodes: SSH in")
        permissions: list[dict[str, Any]] = []
    else:
        group_id, permissions = found["GroupId"], found.get("IpPermissions") or []
    plan = ingress_plan(
        permissions, group_id, owner=owner, cidr=ssh_cidr, now=now or datetime.now(UTC)
    )
    for rule in plan.revoke:
        _tolerant(ec2.revoke_security_group_ingress, "InvalidPermission.NotFound",
                  GroupId=group_id, IpPermissions=[rule])  # fmt: skip
    for rule in plan.authorize:
        _tolerant(ec2.authorize_security_group_ingress, "InvalidPermission.Duplicate",
                  GroupId=group_id, IpPermissions=[rule])  # fmt: skip
    if plan.refresh:
        _tolerant(ec2.update_security_group_rule_descriptions_ingress, "InvalidPermission.NotFound",
                  GroupId=group_id, IpPermissions=plan.refresh)  # fmt: skip
    return group_id


def ports_rules(cidr: str, ports: tuple[str, ...]) -> list[dict[str, Any]]:
    """TCP ingress from `cidr` to each port or range ("6006", "8000-8010"). Pure."""
    v4 = ip_network(cidr).version == 4
    key, field = ("IpRanges", "CidrIp") if v4 else ("Ipv6Ranges", "CidrIpv6")
    rules = []
    for port in ports:
        low, high = port_range(port)
        rules.append({"IpProtocol": "tcp", "FromPort": low, "ToPort": high, key: [{field: cidr}]})
    return rules


def ports_group_name(cidr: str, ports: tuple[str, ...]) -> str:
    """The name of the group that opens exactly `ports` to `cidr`: `orch-ports-` and a digest,
    so jobs asking for the same ports share one group, and a group's rules never change."""
    digest = hashlib.sha256(f"{cidr} {' '.join(sorted(ports))}".encode()).hexdigest()[:12]
    return f"orch-ports-{digest}"


def ensure_ports_group(ec2: Any, vpc_id: str, cidr: str, ports: tuple[str, ...]) -> str:
    """The group of the VPC that opens `ports` (TCP) to `cidr` and nothing else, created when
    missing and left in place for the next job with the same ports (groups cost nothing); its
    rules are set back to exactly these when found."""
    name = ports_group_name(cidr, ports)
    found = find_group(ec2, vpc_id, name)
    if found is None:
        description = f"orch job ports {', '.join(ports)} from {cidr}"
        group_id = _create_group(ec2, vpc_id, name, description)
        revoke, authorize = [], ports_rules(cidr, ports)
    else:
        group_id = found["GroupId"]
        revoke, authorize = rules_plan(found.get("IpPermissions") or [], ports_rules(cidr, ports))
    if revoke:
        ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=revoke)
    if authorize:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=authorize)
    return group_id


def default_subnets(ec2: Any, vpc_id: str) -> dict[str, str]:
    subnets = ec2.describe_subnets(
        Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
    )["Subnets"]
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def describe_image(ec2: Any, region: str, image_id: str) -> dict[str, Any]:
    """The description of image `image_id` (`aws.ami_id`); `ProviderError` when unknown."""
    try:
        found = ec2.describe_images(ImageIds=[image_id])["Images"]
    except ClientError as exc:
        if not error_code(exc).startswith("InvalidAMIID"):
            raise
        found = []
    if not found:
        raise ProviderError(
            f"image {image_id} (aws.ami_id) does not exist in {region}",
            hint="image ids differ per region: set aws.ami_id to one of this region's images",
        )
    return found[0]


def root_device_name(image: dict[str, Any]) -> str:
    """The device name of an image's root volume, where its block device mapping goes. Pure."""
    name = image.get("RootDeviceName")
    if not name:
        raise ProviderError(
            f"image {image.get('ImageId')} reports no root device name, so its root volume "
            "cannot be encrypted",
            hint="use an EBS-backed image (aws.ami_id / aws.ami_name)",
        )
    return str(name)


def root_volume_gb(image: dict[str, Any]) -> int | None:
    """The size of an image's root snapshot in GB (a smaller root volume is refused). Pure."""
    name = image.get("RootDeviceName")
    for mapping in image.get("BlockDeviceMappings") or []:
        size = (mapping.get("Ebs") or {}).get("VolumeSize")
        if mapping.get("DeviceName") == name and isinstance(size, int):
            return size
    return None


def find_image(ec2: Any, region: str, settings: AwsSettings) -> dict[str, Any]:
    """Newest available x86_64 image named like `aws.ami_name` (owners `aws.ami_owners`)."""
    args: dict[str, Any] = {
        "Filters": [
            {"Name": "name", "Values": [settings.ami_name]},
            {"Name": "state", "Values": ["available"]},
        ]
    }
    if settings.ami_owners:
        args["Owners"] = list(settings.ami_owners)
    found = ec2.describe_images(**args)["Images"]
    images = [i for i in found if i.get("Architecture", "x86_64") == "x86_64"]
    if not images:
        raise ProviderError(
            f"no image named {settings.ami_name!r} in {region}",
            hint="set aws.ami_id (ORCH_AWS_AMI_ID) or aws.ami_name in ORCH_HOME/config.yaml",
        )
    return max(images, key=lambda i: (i.get("CreationDate", ""), i["ImageId"]))
