"""Spot interruption notices: the poller that runs on a node, and how its output is read.

The poller is a stdlib-only Python program sent to the node on its command line (nothing is
installed there). It polls the instance metadata endpoint the way EC2 documents for IMDSv2: a
session token from `PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action`
every `interval` seconds (404 = no notice). It prints one line per thing worth saying:

    ready                       the endpoint answered (once)
    notice {"action": ..., "time": ...}   a notice was posted (once; polling goes on)
    unavailable <why>           no endpoint answered several times in a row before any did;
                                the poller exits (the node has no metadata service)

Proxies are bypassed: the endpoint is link-local (or loopback for local nodes).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime

DEFAULT_METADATA_URL = "http://169.254.169.254"
UNAVAILABLE_AFTER = 3  # failed polls before any success that mean "no metadata service"

POLLER = r"""
import json, sys, time, urllib.error, urllib.request
base, interval = sys.argv[1].rstrip("/"), float(sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
token, token_at, ready, noticed, failures = None, 0.0, False, False, 0
while True:
    try:
        if token is None or time.monotonic() - token_at > 300:
            req = urllib.request.Request(base + "/latest/api/token", method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "600"})
            token, token_at = opener.open(req, timeout=2).read().decode(), time.monotonic()
        req = urllib.request.Request(base + "/latest/meta-data/spot/instance-action",
            headers={"X-aws-ec2-metadata-token": token})
        try:
            body = opener.open(req, timeout=2).read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                token = None
            elif exc.code != 404:
                raise
            body = None
        failures = 0
        if not ready:
            ready = True
            print("ready", flush=True)
        if body is not None and not noticed:
            noticed = True
            print("notice " + json.dumps(json.loads(body)), flush=True)
    except Exception as exc:
        failures += 1
        if not ready and failures >= UNAVAILABLE_AFTER:
            print("unavailable " + repr(exc)[:200], flush=True)
            sys.exit(0)
    time.sleep(interval)
""".replace("UNAVAILABLE_AFTER", str(UNAVAILABLE_AFTER))


def poller_command(metadata_url: str | None, interval_s: float) -> str:
    """Shell command that runs the poller on a node against `metadata_url` (None: EC2's)."""
    if interval_s <= 0:
        raise ValueError(f"poll interval must be positive, not {interval_s}")
    url = metadata_url or DEFAULT_METADATA_URL
    return shlex.join(["python3", "-u", "-c", POLLER, url, f"{interval_s:g}"])


@dataclass(frozen=True)
class SpotNotice:
    """A posted interruption notice."""

    action: str  # "terminate", "stop" or "hibernate"
    time: datetime | None  # UTC time the node will be taken (None: the notice did not say)


@dataclass(frozen=True)
class PollerLine:
    kind: str  # "ready" | "notice" | "unavailable" | "garbage"
    notice: SpotNotice | None = None
    detail: str = ""


def parse_poller_line(line: str) -> PollerLine:
    """Read one line of the poller's output; anything unexpected is `garbage`, never an error."""
    text = line.strip()
    word, _, rest = text.partition(" ")
    if word == "ready" and not rest:
        return PollerLine("ready")
    if word == "unavailable":
        return PollerLine("unavailable", detail=rest)
    if word == "notice":
        try:
            document = json.loads(rest)
        except (ValueError, RecursionError):  # nesting past the parser's depth
            return PollerLine("garbage", detail=text[:200])
        if isinstance(document, dict):
            return PollerLine(
                "notice",
                SpotNotice(str(document.get("action", "terminate")), _notice_time(document)),
            )
    return PollerLine("garbage", detail=text[:200])


def _notice_time(document: dict) -> datetime | None:
    value = document.get("time")
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def notice_document(at: datetime) -> dict[str, str]:
    """The instance-action document EC2 posts for a reclaim at `at` (UTC, whole seconds)."""
    return {"action": "terminate", "time": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
