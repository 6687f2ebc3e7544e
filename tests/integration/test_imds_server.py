"""The node metadata endpoint answers like IMDSv2: token first, 404 without a notice."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

from orchestrator.node.imds_server import MetadataState, serve
from tests.support.metadata_endpoint import endpoint

__all__ = ["endpoint"]  # the fixture, imported for pytest


def _request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def _token(base: str) -> str:
    code, token = _request(
        base + "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    assert code == 200 and token
    return token


def test_gets_need_a_token(endpoint: tuple[str, Path]) -> None:
    base, _ = endpoint
    assert _request(base + "/latest/meta-data/instance-id")[0] == 401
    assert _request(base + "/latest/meta-data/instance-id", headers={
        "X-aws-ec2-metadata-token": "forged"})[0] == 401  # fmt: skip
    assert _request(base + "/latest/api/token", "PUT")[0] == 400  # no TTL header


def test_instance_action_is_404_until_a_notice_is_written(endpoint: tuple[str, Path]) -> None:
    base, notice = endpoint
    headers = {"X-aws-ec2-metadata-token": _token(base)}
    assert _request(base + "/latest/meta-data/instance-id", headers=headers) == (200, "l-abc")
    action = base + "/latest/meta-data/spot/instance-action"
    assert _request(action, headers=headers)[0] == 404
    notice.write_text(json.dumps({"action": "terminate", "time": "2026-11-30T10:00:00Z"}))
    code, body = _request(action, headers=headers)
    assert code == 200
    assert json.loads(body) == {"action": "terminate", "time": "2026-11-30T10:00:00Z"}


def test_an_instance_profile_s_credentials_reach_boto3(tmp_path: Path) -> None:
    """botocore's own instance-metadata fetcher (what the nodes' agents use) reads them."""
    from botocore.utils import InstanceMetadataFetcher

    server = serve("127.0.0.1", 0, MetadataState("l-abc", tmp_path / "n.json", role="orch-node"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        fetched = InstanceMetadataFetcher(timeout=2, num_attempts=1, base_url=base)
        credentials = fetched.retrieve_iam_role_credentials()
        assert credentials["role_name"] == "orch-node"
        assert credentials["access_key"].startswith("ASIA") and credentials["token"]
        listing = base + "latest/meta-data/iam/security-credentials/"
        token = _token(base.rstrip("/"))
        assert _request(listing, headers={"X-aws-ec2-metadata-token": token}) == (200, "orch-node")
    finally:
        server.shutdown()
        server.server_close()


def test_no_role_no_credentials(endpoint: tuple[str, Path]) -> None:
    base, _ = endpoint
    headers = {"X-aws-ec2-metadata-token": _token(base)}
    path = "/latest/meta-data/iam/security-credentials/"
    assert _request(base + path, headers=headers)[0] == 404
