"""Spot interruption notices: the node's notice file, how orch follows it, how it is read.

The node's guard watches for notices as one of its events (`notice_event`, stdlib only): it
polls the instance metadata endpoint its terms name the way EC2 documents for IMDSv2 (a
session token from `PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action`
every `notice_interval_s` seconds; 404 = no notice) and appends one line per thing worth
saying to the node's notice file, `orch-jobs/.node/spot-notices` under the login user's home:

    ready                       the endpoint answered (once per start of the guard)
    notice {"action": ..., "time": ...}   a notice was posted (once; polling goes on)
    unavailable <why>           no endpoint answered several times in a row before any did,
                                or the terms name none; the watch ends (the node has no
                                metadata service)

The controller follows that file over SSH (`follow_command`). Its lines are the node's:
`parse_poller_line` reads each as data, anything unexpected is `garbage`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.node import notice_event
from orchestrator.node.launch import home_expr

DEFAULT_METADATA_URL = "http://169.254.169.254"  # EC2's instance metadata endpoint
NOTICE_PATH = "/".join((*notice_event.FOLDER, notice_event.NOTICE_FILE))  # home-relative


FOLLOW_POLL_S = 0.2  # how often `tail` looks when it cannot be told (a file not there at first)


def follow_command() -> str:
    """Shell command that prints the node's notice file from its first line, then each line
    the guard appends, until the channel closes (a file not there yet is waited for)."""
    return f"exec tail -n +1 -F -s {FOLLOW_POLL_S} {home_expr(NOTICE_PATH)} 2>/dev/null"


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
