"""A moto EC2 server seen through orch's AWS provider: the provider, the launch request and the
listing of running instances that the AWS integration tests share, and the faults they inject
into RunInstances (botocore hooks that refuse or answer in EC2's words).

Facts about moto 5 these rely on: instances are `running` as soon as they are described,
terminated at once, spot prices are a fixed 0.00001, and ClientToken is not deduplicated by moto
(the provider's own token tag is what makes a retried launch adopt its node). Its instances'
addresses lead nowhere, so these providers do not wait for SSH.

A test module takes the `provider` fixture (a provider on the `moto_endpoint` fixture's server,
with the test's own home) by importing `moto_provider`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ClientError

from orchestrator.config import AwsSettings, Settings
from orchestrator.providers.aws.ec2_requests import new_host_key
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.offers import OfferQuery

REGION = "us-east-1"
PUBLIC_KEY = new_host_key().public_line + " orch-test"  # any valid OpenSSH public key


def make_provider(home: Path, endpoint: str, **aws: Any) -> AwsProvider:
    """A provider on `endpoint` with its home in `home`: one region, fast polls, no wait for
    SSH; `aws` overrides any `AwsSettings` field."""
    options: dict[str, Any] = {
        "regions": [REGION],
        "endpoint_url": endpoint,
        "ami_name": "ubuntu/images/*",
        "ami_owners": [],
        "owner": "tester",
        "poll_interval_s": 0.01,
        "ready_timeout_s": 10,
        "max_api_attempts": 3,
        "wait_for_ssh": False,
    }
    options.update(aws)
    return AwsProvider(Settings(home=home, aws=AwsSettings(**options)))


def request(job: str = "job1", count: int = 2, spot: bool | str = True, **kw: Any) -> LaunchRequest:
    """A launch of `count` one-GPU A10G nodes for `job`; `kw`: any other `LaunchRequest` field."""
    return LaunchRequest(
        job_id=job,
        cluster=job,
        count=count,
        gpus_per_node=1,
        public_key=PUBLIC_KEY,
        spot=spot,  # type: ignore[arg-type]
        accelerator="A10G",
        **kw,
    )


def running(provider: AwsProvider, **filters: str) -> list[dict]:
    """The pending or running instances of the provider's region (EC2's descriptions), narrowed
    by `filters` (EC2 filter name -> value)."""
    flt = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    flt += [{"Name": k, "Values": [v]} for k, v in filters.items()]
    pages = provider.client(REGION).get_paginator("describe_instances").paginate(Filters=flt)
    return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]


def refuse(code: str, when: Any) -> Any:
    """A botocore hook that fails RunInstances with `code` whenever `when(params)` holds."""

    def hook(params: dict, **_: Any) -> None:
        if when(params):
            raise ClientError({"Error": {"Code": code, "Message": "injected"}}, "RunInstances")

    return hook


class Body:
    """An answer body as botocore streams it."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Any:
        yield self.data


def ec2_error(url: str, status: int, code: str) -> AWSResponse:
    """An EC2 error answer, as EC2 words it on the wire."""
    body = (
        f"<Response><Errors><Error><Code>{code}</Code><Message>injected</Message></Error>"
        "</Errors><RequestID>x</RequestID></Response>"
    ).encode()
    return AWSResponse(url, status, {}, Body(body))


def zone_of(request: AWSPreparedRequest) -> str:
    """The zone a RunInstances request asks for."""
    from urllib.parse import parse_qs

    body = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
    return parse_qs(body)["Placement.AvailabilityZone"][0]


def provider_query() -> OfferQuery:
    """The offer query of the default `request()`."""
    return OfferQuery.from_resources(request())


@pytest.fixture(name="provider")
def moto_provider(tmp_path: Path, moto_endpoint: str) -> AwsProvider:
    """A provider on the moto server of tests/integration/conftest.py, its home in tmp_path."""
    return make_provider(tmp_path, moto_endpoint)
