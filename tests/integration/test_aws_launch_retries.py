"""The AWS provider's RunInstances retries against a moto EC2 server on 127.0.0.1, through a real
boto3 client: throttling and server errors repeated in place, a capacity refusal moving to the
next zone at once, a lost answer repeated without launching twice (the provider's token tag),
and a launch whose last answer was lost leaving nothing running. Faults are injected at
botocore's `before-send` of RunInstances, on the client the provider sends it with
(`launch_client`), or by a proxy in front of moto that hangs up after moto has answered.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse

from orchestrator.errors import ProviderError
from orchestrator.providers.aws.provider import AwsProvider
from tests.support.aws_moto import (  # noqa: F401  (the fixture)
    REGION,
    Body,
    ec2_error,
    make_provider,
    moto_provider,
    provider_query,
    request,
    running,
    zone_of,
)

pytestmark = pytest.mark.timeout(60)


def test_retried_launch_does_not_launch_twice(provider: AwsProvider) -> None:
    first = provider.launch(request())
    again = provider.launch(request())
    assert [n.instance_id for n in again] == [n.instance_id for n in first]
    assert len(running(provider)) == 2
    tokens = {
        t["Value"] for d in running(provider) for t in d["Tags"] if t["Key"] == "orch-launch-token"
    }
    assert len(tokens) == 2
    retry = provider.launch(request(attempt=1))  # a new attempt is new nodes
    assert not {n.instance_id for n in retry} & {n.instance_id for n in first}


def test_throttling_is_retried(provider: AwsProvider) -> None:
    failures = []

    def throttle_once(request: Any, **_: Any) -> AWSResponse | None:
        if not failures:
            failures.append(request.url)
            return ec2_error(request.url, 503, "RequestLimitExceeded")
        return None

    provider.launch_client(REGION).meta.events.register(
        "before-send.ec2.RunInstances", throttle_once
    )
    nodes = provider.launch(request(count=1))
    assert len(failures) == 1 and len(nodes) == 1


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "InsufficientCapacity",
                                  "UnfulfillableCapacity"])  # fmt: skip
def test_a_capacity_500_moves_on_at_once_without_retries(
    tmp_path: Path, moto_endpoint: str, code: str
) -> None:
    provider = make_provider(tmp_path, moto_endpoint, max_api_attempts=8)
    first_zone = provider.offers(provider_query())[0].zone
    sent: list[str] = []

    def no_capacity_in_first_zone(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        sent.append(zone_of(request))
        if sent[-1] == first_zone:
            return ec2_error(request.url, 500, code)  # EC2 refuses capacity with HTTP 500
        return None

    provider.launch_client(REGION).meta.events.register(
        "before-send.ec2.RunInstances", no_capacity_in_first_zone
    )
    began = time.monotonic()
    nodes = provider.launch(request())
    took = time.monotonic() - began
    assert sent.count(first_zone) == 1, sent  # one try, then the next zone
    assert len(sent) == 3 and len({n.zone for n in nodes}) == 1 and nodes[0].zone != first_zone
    assert took < 5, f"failover took {took:.1f} s"


def test_run_instances_repeats_throttling_and_server_errors_then_launches_once(
    tmp_path: Path, moto_endpoint: str
) -> None:
    waits: list[float] = []
    provider = AwsProvider(
        make_provider(tmp_path, moto_endpoint, max_api_attempts=4).settings, sleep=waits.append
    )
    answers = iter([(503, "RequestLimitExceeded"), (500, "InternalError"), (502, "BadGateway")])
    sent: list[str] = []

    bodies: set[str] = set()

    def flaky(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        sent.append(zone_of(request))
        bodies.add(str(request.body))
        answer = next(answers, None)
        return ec2_error(request.url, *answer) if answer else None

    provider.launch_client(REGION).meta.events.register("before-send.ec2.RunInstances", flaky)
    (node,) = provider.launch(request(count=1))
    assert len(sent) == 4 and len(set(sent)) == 1  # repeated in place, not failed over
    assert len(bodies) == 1  # the very same call each time (token, user data, host key)
    backoffs = [w for w in waits if w != provider.aws.poll_interval_s]
    assert len(backoffs) <= 3 and all(0 <= w < 8 for w in backoffs)
    assert [d["InstanceId"] for d in running(provider)] == [node.instance_id]


def test_run_instances_gives_up_after_max_api_attempts(tmp_path: Path, moto_endpoint: str) -> None:
    provider = AwsProvider(
        make_provider(tmp_path, moto_endpoint, max_api_attempts=3).settings, sleep=lambda s: None
    )
    sent: list[str] = []

    def broken(request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        sent.append(zone_of(request))
        return ec2_error(request.url, 500, "InternalError")

    provider.launch_client(REGION).meta.events.register("before-send.ec2.RunInstances", broken)
    with pytest.raises(ProviderError, match="InternalError") as caught:
        provider.launch(request(count=1))
    assert len(sent) == 3 and caught.value.exit_code == 3
    assert running(provider) == []


def test_a_lost_answer_is_repeated_without_launching_twice(
    tmp_path: Path, moto_endpoint: str
) -> None:
    from botocore.httpsession import URLLib3Session

    provider = AwsProvider(make_provider(tmp_path, moto_endpoint).settings, sleep=lambda s: None)
    session = URLLib3Session()
    sent: list[str] = []

    def answer_lost(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        sent.append(zone_of(request))
        if len(sent) == 1:
            session.send(request)  # EC2 launches the node, the answer never arrives
            return ec2_error(request.url, 503, "ServiceUnavailable")
        return None

    provider.launch_client(REGION).meta.events.register("before-send.ec2.RunInstances", answer_lost)
    (node,) = provider.launch(request(count=1))
    assert len(sent) == 1  # the repeat found the node by its token and sent nothing
    assert [d["InstanceId"] for d in running(provider)] == [node.instance_id]


def test_an_answer_that_is_not_ec2s_is_a_provider_error_or_a_repeat(
    tmp_path: Path, moto_endpoint: str
) -> None:
    page = b"<!doctype html><title>500 Internal Server Error</title>"  # a proxy's, not EC2's

    def html(request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, 500, {}, Body(page))

    provider = AwsProvider(make_provider(tmp_path, moto_endpoint).settings, sleep=lambda s: None)
    provider.client(REGION).meta.events.register("before-send.ec2.DescribeInstances", html)
    with pytest.raises(ProviderError, match="AWS failed to describe instances"):
        provider.list_owned()

    other = AwsProvider(make_provider(tmp_path, moto_endpoint).settings, sleep=lambda s: None)
    sent: list[str] = []

    def html_once(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        sent.append(zone_of(request))
        return html(request) if len(sent) == 1 else None

    other.launch_client(REGION).meta.events.register("before-send.ec2.RunInstances", html_once)
    (node,) = other.launch(request(count=1))
    assert len(sent) == 2 and [d["InstanceId"] for d in running(other)] == [node.instance_id]


def test_other_calls_keep_botocores_retries(provider: AwsProvider) -> None:
    sent: list[str] = []

    def unavailable_once(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        sent.append(request.url)
        return ec2_error(request.url, 503, "Unavailable") if len(sent) == 1 else None

    provider.client(REGION).meta.events.register(
        "before-send.ec2.DescribeInstances", unavailable_once
    )
    assert provider.list_owned() == []
    assert len(sent) == 2


class _CuttingProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto. `fate(n)` decides what becomes of the n-th
    RunInstances call (from 1): "pass" hands it on, "throttle" answers 503 RequestLimitExceeded
    without handing it on, "cut" hands it on and hangs up once moto has answered, so the
    instance exists and the caller never hears of it. Every other call is handed on."""

    def __init__(self, upstream: str, fate: Any) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        target = urlsplit(upstream)
        self.run_instances = 0
        self.cut_ids: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                what = "pass"
                if b"Action=RunInstances" in body:
                    proxy.run_instances += 1
                    what = fate(proxy.run_instances)
                if what == "throttle":
                    error = (
                        "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>"
                        "slow down</Message></Error></Errors><RequestID>x</RequestID></Response>"
                    )
                    self._send(503, [], error.encode())
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                upstream.request("POST", self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                data = reply.read()
                upstream.close()
                if what == "cut":
                    proxy.cut_ids.append(data.decode().split("<instanceId>")[1].split("<")[0])
                    self.close_connection = True  # hang up: no answer at all
                    return
                self._send(reply.status, reply.getheaders(), data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _CuttingProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


FATES = {
    # one node, one try, and its answer lost
    "only try lost": (1, 1, lambda n: "cut"),
    # rank 0 launches; rank 1 is throttled twice, then its third and last try's answer is lost
    "last try of rank 1 lost": (
        2,
        3,
        lambda n: {1: "pass", 2: "throttle", 3: "throttle"}.get(n, "cut"),
    ),
}


@pytest.mark.parametrize("case", list(FATES))
def test_a_launch_whose_last_answer_was_lost_leaves_nothing_running(
    tmp_path: Path, moto_endpoint: str, case: str
) -> None:
    count, attempts, fate = FATES[case]
    with _CuttingProxy(moto_endpoint, fate) as proxy:
        provider = AwsProvider(
            make_provider(tmp_path, proxy.url, max_api_attempts=attempts).settings,
            sleep=lambda s: None,
        )
        with pytest.raises(ProviderError, match="could not be reached"):
            provider.launch(request(count=count))
        assert len(proxy.cut_ids) == 1  # EC2 did start the node whose answer was lost
    direct = make_provider(tmp_path, moto_endpoint)
    assert running(direct) == [] and direct.list_owned() == []
