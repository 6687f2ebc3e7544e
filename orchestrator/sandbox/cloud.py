"""moto's EC2, in this process: its image, its default VPC, and the state changes EC2 makes itself.

Reads go through moto's HTTP API like any client's. A few changes have no API because on AWS
only EC2 itself makes them; they are made on moto's in-process backend (moto 5):

- an instance stays `pending` until its host answers SSH (`mark_booting` / `mark_running`),
  so `running` means what it means to a user: the machine can be logged into;
- a reclaimed spot instance is terminated with state reason `Server.SpotInstanceTermination`,
  and one whose host could not be built with `Server.InternalError` (`terminate`);
- the region's default VPC is the sandbox's network (`prepare_network`): moto's own default VPC
  (172.31.0.0/16) is deleted, and a default VPC on the sandbox range takes its place.

The image is given to moto before it is imported (`MOTO_AMIS_PATH`, moto's documented way to
choose its AMIs): one Amazon-owned image whose name matches orch's default `aws.ami_name`, so
orch finds it exactly as it finds the Deep Learning AMI on AWS.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from orchestrator.config import AwsSettings
from orchestrator.errors import ProviderError
from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.network import SandboxNetwork

LIVE = ("pending", "running")
SANDBOX_AMI_ID = "ami-0a1b2c3d4e5f60718"
CREDENTIALS = {"aws_access_key_id": "sandbox", "aws_secret_access_key": "sandbox"}
INTERNAL_ERROR = "Server.InternalError"
SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"  # the host ran its own `shutdown`
SPOT_TERMINATION = "Server.SpotInstanceTermination"  # EC2's state reason of a spot reclaim
SERVER_MODULES = ("moto", "werkzeug", "flask")  # moto[server]: the sandbox serves moto's EC2
DEV_EXTRA = "install orch's dev extra: pip install 'orch[dev]' (a clone: pip install -e '.[dev]')"


def require_moto() -> None:
    """Raise `SandboxError` saying how to install them when moto's server or what it serves
    with is not installed (only the `dev` extra brings them). Imports none of them: moto must
    be imported only once `MotoCloud.load` has given it its image."""
    missing = [name for name in SERVER_MODULES if not _installed(name)]
    if missing:
        raise SandboxError(
            f"the sandbox needs moto's server (moto[server,ec2]); missing: {', '.join(missing)}",
            hint=DEV_EXTRA,
        )


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def image_name(pattern: str | None = None) -> str:
    """A name matching orch's default image pattern, every `*` filled in with `sandbox`."""
    return (pattern or AwsSettings().ami_name).replace("*", "sandbox")


def write_image_file(path: Path) -> Path:
    """The MOTO_AMIS_PATH file: one x86_64 HVM image owned by Amazon."""
    image = {
        "ami_id": SANDBOX_AMI_ID,
        "name": image_name(),
        "description": "orch sandbox image: this machine's software, user ubuntu",
        "owner_id": "898082745236",
        "public": True,
        "virtualization_type": "hvm",
        "architecture": "x86_64",
        "state": "available",
        "platform": None,
        "image_type": "machine",
        "hypervisor": "xen",
        "root_device_name": "/dev/sda1",
        "root_device_type": "ebs",
        "sriov": "simple",
        "creation_date": "2026-01-01T00:00:00.000Z",
    }
    path.write_text(json.dumps([image], indent=1) + "\n")
    return path


class MotoCloud:
    """moto's EC2 for one region. `load` first (before anything imports moto), then `app()`,
    then, once the gateway serves it at `endpoint`, `attach(endpoint)` and the rest."""

    def __init__(self, region: str, network: SandboxNetwork) -> None:
        self.region = region
        self.network = network
        self.endpoint: str | None = None
        self.subnets: dict[str, str] = {}  # zone -> subnet id
        self._client: Any = None
        # moto is not thread-safe (a DescribeInstances that serializes an instance while a
        # RunInstances adds volumes fails with HTTP 500): every call into it, over HTTP (the
        # gateway) or in process (below), holds this lock.
        self.lock = threading.RLock()

    # --- start ----------------------------------------------------------------------------------

    @staticmethod
    def load(image_file: Path) -> None:
        """Give moto its image list, then import it. Refuses if moto was imported already."""
        if any(name == "moto" or name.startswith("moto.") for name in sys.modules):
            raise ProviderError(
                "moto was imported before the sandbox could give it its image",
                hint="run the sandbox in its own process: orch sandbox aws",
            )
        os.environ["MOTO_AMIS_PATH"] = str(image_file)
        try:
            import moto.ec2.models  # noqa: F401
            from moto.moto_server import werkzeug_app  # noqa: F401
        except ImportError as exc:
            raise SandboxError(f"the sandbox needs moto's server ({exc})", hint=DEV_EXTRA) from exc

    @staticmethod
    def app() -> Any:
        """moto's WSGI application (every service; the gateway sends EC2 calls to it)."""
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        return DomainDispatcherApplication(create_backend_app)

    def attach(self, endpoint: str) -> None:
        """Use the API at `endpoint` (the gateway in front of moto) for every read."""
        self.endpoint = endpoint
        self._client = boto3.client(
            "ec2",
            region_name=self.region,
            endpoint_url=endpoint,
            config=Config(retries={"mode": "standard", "max_attempts": 2}),
            **CREDENTIALS,
        )

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError("MotoCloud.attach() was not called")
        return self._client

    def _backend(self) -> Any:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        return ec2_backends[DEFAULT_ACCOUNT_ID][self.region]

    def zones(self, count: int) -> list[str]:
        """The first `count` availability zones of the region, by name (asked before serving)."""
        names = sorted(zone.name for zone in self._backend().describe_availability_zones())
        if len(names) < count:
            raise ProviderError(f"{self.region} has {len(names)} zones, {count} were asked for")
        return names[:count]

    def prepare_network(self, zones: list[str]) -> dict[str, str]:
        """Make the sandbox range the region's default VPC with one default subnet per zone.

        Subnets do not map public IPs: a sandbox host has only its private address, which is
        what orch connects to. Returns {zone: subnet id}.
        """
        ec2 = self.client
        for vpc in ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]:
            subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
            for subnet in subnets["Subnets"]:
                ec2.delete_subnet(SubnetId=subnet["SubnetId"])
            ec2.delete_vpc(VpcId=vpc["VpcId"])
        with self.lock:
            backend = self._backend()
            vpc = backend.create_vpc(cidr_block=str(self.network.cidr), is_default=True)
            backend.default_vpc = vpc
        ec2.create_tags(Resources=[vpc.id], Tags=[{"Key": "Name", "Value": "orch-sandbox"}])
        for zone, block in self.network.subnets(zones).items():
            subnet = ec2.create_subnet(VpcId=vpc.id, CidrBlock=str(block), AvailabilityZone=zone)
            subnet_id = subnet["Subnet"]["SubnetId"]
            ec2.modify_subnet_attribute(SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": False})
            self.subnets[zone] = subnet_id
        return dict(self.subnets)

    def zone_of_subnet(self, subnet_id: str) -> str | None:
        return next((zone for zone, sid in self.subnets.items() if sid == subnet_id), None)

    # --- reads (over the API) -------------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        """Every instance of the region, as DescribeInstances describes it."""
        pages = self.client.get_paginator("describe_instances").paginate()
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def describe(self, instance_id: str) -> dict[str, Any] | None:
        """The instance as DescribeInstances describes it; None when EC2 does not know it."""
        found = self.client.describe_instances(
            Filters=[{"Name": "instance-id", "Values": [instance_id]}]
        )["Reservations"]
        return next((i for r in found for i in r["Instances"]), None)

    def user_data(self, instance_id: str) -> str:
        """The instance's user data, decoded ("" when it has none or it is not text)."""
        reply = self.client.describe_instance_attribute(
            InstanceId=instance_id, Attribute="userData"
        )
        encoded = (reply.get("UserData") or {}).get("Value") or ""
        try:
            raw = base64.b64decode(encoded)
            if raw[:2] == b"\x1f\x8b":  # gzipped, as orch sends it: cloud-init unpacks it
                raw = gzip.decompress(raw)
            return raw.decode("utf-8")
        except (ValueError, UnicodeDecodeError, OSError, EOFError):
            return ""

    def key_pair_public(self, key_name: str | None) -> str | None:
        """The public key of the key pair the instance was launched with (moto keeps it)."""
        if not key_name:
            return None
        pairs = self.client.describe_key_pairs(KeyNames=[key_name], IncludePublicKey=True)
        return next((p.get("PublicKey") for p in pairs["KeyPairs"]), None)

    # --- changes only EC2 makes (in process) ----------------------------------------------------

    def mark_booting(self, instance_ids: Iterable[str]) -> None:
        """Just launched: `pending` until their hosts answer (moto starts them `running`)."""
        with self.lock:
            backend = self._backend()
            for iid in instance_ids:
                instance = backend.get_instance(iid)
                if instance.state == "running":
                    instance.instance_state.name, instance.instance_state.code = "pending", 0

    def mark_running(self, instance_id: str) -> bool:
        """Its host answers: `pending` -> `running`. False when it is no longer pending."""
        with self.lock:
            instance = self._backend().get_instance(instance_id)
            if instance.state != "pending":
                return False
            instance.instance_state.name, instance.instance_state.code = "running", 16
            return True

    def terminate(self, instance_id: str, code: str, message: str) -> bool:
        """Terminate as EC2 does on its own, with state reason `code`. False if already gone."""
        from moto.ec2.models.instances import StateReason

        with self.lock:
            instance = self._backend().get_instance(instance_id)
            if instance.state not in LIVE:
                return False
            instance.terminate()
            instance.state_reason = StateReason(f"{code}: {message}", code)
            return True
