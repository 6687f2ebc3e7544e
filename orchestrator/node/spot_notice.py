"""Spot interruption notices: the poller that runs on a node, and how its output is read.

The poller (`notice_poller`, the node runtime's `notice-poller`) is a stdlib-only program. It
polls the instance metadata endpoint the way EC2 documents for IMDSv2: a
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
from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.node import runtime

DEFAULT_METADATA_URL = "http://169.254.169.254"


def poller_command(metadata_url: str | None, interval_s: float) -> str:
    """Shell command that runs the poller (the node runtime's `notice-poller`, which the node
    must hold) against `metadata_url` (None: EC2's)."""
    if interval_s <= 0:
        raise ValueError(f"poll interval must be positive, not {interval_s}")
    url = metadata_url or DEFAULT_METADATA_URL
    return runtime.program_command("notice-poller", url, f"{interval_s:g}")


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
