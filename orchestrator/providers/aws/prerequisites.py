"""What the AWS provider needs (`orch check aws`): the controller's rsync and ssh, credentials
that STS accepts, and regions in use that EC2 has enabled for the account.

Asks AWS read-only questions only (sts:GetCallerIdentity, and per region
ec2:DescribeInstanceTypeOfferings, which every launch asks first), each tried twice at most
with short timeouts, so a machine without a route to AWS hears so in seconds.
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from orchestrator.config import Settings
from orchestrator.errors import OrchError
from orchestrator.providers.aws import network as aws_network
from orchestrator.providers.check import Readiness, Requirement, controller_tools

_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 2}, connect_timeout=5, read_timeout=15
)
CREDENTIALS_FIX = (
    "give orch AWS credentials: `aws configure` (or `aws sso login` with AWS_PROFILE), or set "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
)


def aws_readiness(settings: Settings, *, path: str | None = None) -> Readiness:
    """The AWS provider's requirements as found from here (`path`: the PATH for the tools)."""
    items = controller_tools(path=path)
    try:
        regions = aws_network.regions(settings.aws)
    except OrchError as exc:  # a Terraform outputs file that cannot be read
        items.append(Requirement("regions", False, exc.message, exc.hint or ""))
        return Readiness("aws", tuple(items))
    endpoint = settings.aws.endpoint_url

    def client(service: str, region: str = regions[0]) -> Any:
        return boto3.client(service, region_name=region, endpoint_url=endpoint, config=_CONFIG)

    identity = _credentials(client)
    items.append(identity)
    if identity.ok:
        items += _regions(client, regions)
    else:
        items.append(
            Requirement(
                "regions",
                False,
                f"{', '.join(regions)}: not checked without credentials",
                needed=False,
            )
        )
    return Readiness("aws", tuple(items))


def _failure(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', exc)}"
    return str(exc)


def _credentials(client: Any) -> Requirement:
    if boto3.Session().get_credentials() is None:
        return Requirement("AWS credentials", False, "none found", CREDENTIALS_FIX)
    try:
        reply = client("sts").get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        return Requirement(
            "AWS credentials", False, f"STS refused them: {_failure(exc)}", CREDENTIALS_FIX
        )
    return Requirement("AWS credentials", True, f"account {reply['Account']} ({reply['Arn']})")


def _regions(client: Any, regions: list[str]) -> list[Requirement]:
    """Each region in use: one EC2 knows of (botocore's own list) and that answers the first
    call of every launch, listing instance type offerings (an opt-in region that the account
    has not enabled refuses it)."""
    fix = "set aws.regions (ORCH_AWS_REGIONS) to regions enabled for the account"
    known = set(boto3.Session().get_available_regions("ec2"))
    items = []
    for region in regions:
        name = f"region {region}"
        if region not in known:
            items.append(Requirement(name, False, "EC2 knows no such region", fix))
            continue
        try:
            client("ec2", region).describe_instance_type_offerings(MaxResults=5)
        except (BotoCoreError, ClientError) as exc:
            items.append(
                Requirement(name, False, f"EC2 refused to list offers: {_failure(exc)}", fix)
            )
        else:
            items.append(Requirement(name, True, "enabled (EC2 lists its offers)"))
    return items
