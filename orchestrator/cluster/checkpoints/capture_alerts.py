"""Checkpoint files rewritten again and again that no copy was taken of: never silence.

A node's agent lists such files in its manifest (`NodeManifest.uncaptured`: see
`orchestrator.node.checkpoint_capture`). The keeper hands each collection's reports to
`CaptureAlerts`, which says once, as a `WARNING` event, when a file starts going without a copy
("node 0: snapshot.pt rewritten every 1.5 s, none captured for 4 min (since 12:03:10 UTC)"),
and once, as a `CAPTURED` event, when a copy of it is taken again. `active_alerts` reads those
events back: what `orch status JOB` shows as the checkpoints' line while the job runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from orchestrator.node.checkpoint_files import shown
from orchestrator.node.checkpoint_protocol import AgentReport, Uncaptured

ALERT_KIND = "WARNING"
CLEARED_KIND = "CAPTURED"
ALERT_PREFIX = "checkpoints not captured: "
_REWRITTEN = " rewritten every "
_ADVICE = ": the job would resume from an older copy"


def duration_text(seconds: float) -> str:
    """A duration as people say it: "40 s", "4 min", "2.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def alert_key(rank: int, path: str) -> str:
    return f"node {rank}: {shown(path, 200)}"


def alert_message(rank: int, path: str, file: Uncaptured, *, for_s: float, since: datetime) -> str:
    """The WARNING event of a file going without a copy: its key, how often it is rewritten
    and since when none was taken."""
    none = "none captured" if file.ever else "never captured"
    return (
        f"{ALERT_PREFIX}{alert_key(rank, path)}{_REWRITTEN}{file.every_s:.3g} s, {none} for "
        f"{duration_text(for_s)} (since {since:%H:%M:%S} UTC){_ADVICE}, or from the start; "
        "see docs/checkpoints.md"
    )


def cleared_message(rank: int, path: str, *, captured: bool, after_s: float) -> str:
    """The CAPTURED event of a file that had an alert: a copy of it was taken again, or it
    is no longer there to take."""
    what = "captured again" if captured else "no longer there"
    return f"{alert_key(rank, path)} {what}, after {duration_text(after_s)} without a copy"


def active_alerts(events: Iterable[tuple[str, str]]) -> list[str]:
    """The alerts still in force, from a job's events (kind, message) in order: each WARNING
    of `alert_message` not followed by the CAPTURED event of the same file; their messages
    without the prefix, oldest first."""
    active: dict[str, str] = {}
    for kind, message in events:
        if kind == ALERT_KIND and message.startswith(ALERT_PREFIX):
            text = message[len(ALERT_PREFIX) :]
            active[text.rsplit(_REWRITTEN, 1)[0]] = text.rsplit(_ADVICE, 1)[0]
        elif kind == CLEARED_KIND:
            keys = [key for key in active if message.startswith(key + " ")]
            if keys:
                del active[max(keys, key=len)]
    return list(active.values())


class CaptureAlerts:
    """Which files are going without a copy, by (rank, path), across a job's collections; see
    the module docstring. `record(kind, message)` writes an event."""

    def __init__(self, record) -> None:  # noqa: ANN001 - Callable[[str, str], None]
        self.record = record
        self.active: dict[tuple[int, str], float] = {}  # -> when the alert began (epoch s)

    def update(self, reports: Mapping[int, AgentReport], now: datetime | None = None) -> None:
        """Take one collection's reports (nodes that answered): new alerts and cleared ones.
        A node that did not answer keeps its alerts as they were."""
        now = now or datetime.now(UTC)
        for rank, report in sorted(reports.items()):
            manifest = report.manifest
            if manifest is None:
                continue
            files = manifest.uncaptured
            for path, file in sorted(files.items()):
                if (rank, path) in self.active:
                    continue
                since_s = (file.since_ns - manifest.clock_offset_ns) / 1e9
                since = datetime.fromtimestamp(min(since_s, now.timestamp()), UTC)
                for_s = (now - since).total_seconds()
                self.active[(rank, path)] = since.timestamp()
                self.record(ALERT_KIND, alert_message(rank, path, file, for_s=for_s, since=since))
            for key in [k for k in self.active if k[0] == rank and k[1] not in files]:
                after_s = now.timestamp() - self.active.pop(key)
                held = manifest.files.get(key[1])
                captured = held is not None and held.staged is not None
                message = cleared_message(rank, key[1], captured=captured, after_s=after_s)
                self.record(CLEARED_KIND, message)
