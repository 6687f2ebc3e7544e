"""Reading what the node program `bucket-data` prints (`orchestrator.node.bucket_data`).

Pure. The program prints one JSON object a line (`listing`, `plan`, `progress`, then `done`
or `error`). A node is untrusted: every count is taken only when it is a non-negative integer
below `MAX_COUNT`, a message is cut to `MAX_MESSAGE` printable characters, and a line that is
not such an object is kept (bounded) as the node's own output for an error message, never
acted on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MAX_COUNT = 2**62  # more bytes or objects than any node holds: a count past it is not taken
MAX_MESSAGE = 500
MAX_OTHER_LINES = 20  # the node's other output kept for an error message (the last ones)
ERROR_KINDS = ("missing", "denied", "disk", "boto3", "key", "other")


def count(value: object) -> int | None:
    """`value` when it is a plain non-negative integer below `MAX_COUNT`, else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < MAX_COUNT else None


def seconds(value: object) -> float | None:
    """`value` as seconds when it is a finite non-negative number below a year, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < 366 * 86400 else None


def clean_text(value: object, limit: int = MAX_MESSAGE) -> str:
    """`value` as one line of printable text of at most `limit` characters ('' if no text)."""
    if not isinstance(value, str):
        return ""
    text = "".join(ch if ch.isprintable() else " " for ch in value[: limit * 2])
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _object(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and 0 < len(value) <= 2 else None


@dataclass
class BucketLines:
    """What one run of `bucket-data` on one node said so far (`feed` each line)."""

    objects: int | None = None  # listed in the bucket (fetch)
    listed_bytes: int | None = None
    to_fetch: int | None = None  # objects the plan downloads (fetch); files (upload)
    fetch_bytes: int | None = None  # bytes the plan moves
    kept: int | None = None  # objects already on the node
    removed: int | None = None  # files removed from the node (gone from the bucket)
    bytes_done: int = 0  # bytes moved so far
    done: dict[str, float | int | bool] | None = None  # the last line's counts
    error: str | None = None
    kind: str | None = None  # one of ERROR_KINDS when `error`
    other: list[str] = field(default_factory=list)

    def feed(self, line: str) -> None:
        """Take one line of the program's output."""
        found = _object(line)
        if found is None:
            self.other = [*self.other[-(MAX_OTHER_LINES - 1) :], clean_text(line, 300)]
            return
        if "error" in found:
            self.error = clean_text(found["error"]) or "the node program failed without saying why"
            kind = found.get("kind")
            self.kind = kind if isinstance(kind, str) and kind in ERROR_KINDS else "other"
            return
        if len(found) != 1:
            return
        ((name, value),) = found.items()
        if not isinstance(value, dict):
            return
        if name == "listing":
            self.objects, self.listed_bytes = count(value.get("objects")), count(value.get("bytes"))
        elif name == "plan":
            self.to_fetch = count(value.get("fetch"))
            self.fetch_bytes = count(value.get("fetch_bytes"))
            self.kept, self.removed = count(value.get("keep")), count(value.get("remove"))
        elif name == "progress":
            done = count(value.get("bytes"))
            if done is not None:
                self.bytes_done = max(self.bytes_done, done)
            total = count(value.get("total"))
            if total is not None and self.fetch_bytes is None:
                self.fetch_bytes = total
        elif name == "done":
            self.done = _done_counts(value)
            moved = self.done.get("bytes")
            if isinstance(moved, int):
                self.bytes_done = max(self.bytes_done, moved)

    @property
    def total(self) -> int:
        """Bytes this run moves, as far as known (0 before the plan)."""
        return max(self.fetch_bytes or 0, self.bytes_done)


_DONE_COUNTS = ("objects", "fetched", "bytes", "kept", "removed", "files", "skipped")


def _done_counts(value: dict) -> dict[str, float | int | bool]:
    done: dict[str, float | int | bool] = {}
    for key in _DONE_COUNTS:
        number = count(value.get(key))
        if number is not None:
            done[key] = number
    took = seconds(value.get("seconds"))
    if took is not None:
        done["seconds"] = took
    if value.get("missing") is True:
        done["missing"] = True
    return done
