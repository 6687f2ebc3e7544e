"""The CHECKPOINT events of a job: their wording, and how often a single file gets one. Pure.

A directory checkpoint (`step-N/`, a DCP step) is an event per version: each is a new name,
and a script writes one every few minutes at most. A single file rewritten in place (a
`snapshot.pt` saved every second) would be an event per pulled version, thousands an hour, so
its versions are coalesced (`PullThrottle`): the first version a controller sees is an event
at once, later ones at most once per `COALESCE_S` per file (and kind of arrival), the event
counting the versions since the previous one:

    pulled snapshot.pt (1048576 bytes; 57 versions since 10:02:13)

`flush` hands over what is held when a run ends, so that the newest version has its event
before the run's end is recorded, and the first version of the next run has one at once. Every
version still has its ledger record (`CheckpointRecord`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

COALESCE_S = 60.0  # at most one event per single file (and kind of arrival) this often

_VERSIONS = re.compile(r"; (\d+) versions since (\d\d:\d\d:\d\d)\)$")
_TAIL = r" \(\d+ bytes(?:; \d+ versions since \d\d:\d\d:\d\d)?\)$"
_NAME = {
    "pulled": re.compile(r"^pulled (.+)" + _TAIL),
    "stored": re.compile(r"^stored (.+) to \S+" + _TAIL),
}


@dataclass(frozen=True)
class Arrival:
    """A checkpoint version that reached the mirror (`pulled`) or the store (`stored`)."""

    how: str  # pulled | stored
    name: str  # under the checkpoint directory
    size_bytes: int
    step: int | None
    store: str | None = None  # the store's URL, for `stored`

    def message(self, versions: int = 1, since: datetime | None = None) -> str:
        """The event's text; `versions` (> 1) counts those pulled since `since`."""
        where = f" to {self.store}" if self.how == "stored" and self.store else ""
        more = f"; {versions} versions since {since:%H:%M:%S}" if versions > 1 and since else ""
        return f"{self.how} {self.name}{where} ({self.size_bytes} bytes{more})"


def versions_in(message: str) -> int:
    """How many versions a CHECKPOINT event's text counts (1 unless it is coalesced)."""
    found = _VERSIONS.search(message)
    return int(found.group(1)) if found else 1


def since_in(message: str) -> str | None:
    """The time (HH:MM:SS, UTC) from which a coalesced CHECKPOINT event counts; else None."""
    found = _VERSIONS.search(message)
    return found.group(2) if found else None


def name_in(message: str) -> str | None:
    """The checkpoint a CHECKPOINT event's text names; None for a text of another shape."""
    pattern = _NAME.get(message.partition(" ")[0])
    found = pattern.match(message) if pattern else None
    return found.group(1) if found else None


@dataclass
class _File:
    last_event: datetime
    held: Arrival | None = None
    versions: int = 0  # held back since `last_event`


@dataclass(frozen=True)
class Due:
    """An event to write now: `arrival` is the newest of the `versions` it counts."""

    arrival: Arrival
    versions: int
    since: datetime | None  # the previous event of the same file, when it counts more than one

    @property
    def message(self) -> str:
        return self.arrival.message(self.versions, self.since)


@dataclass
class PullThrottle:
    """Which single-file arrivals get an event now (see the module docstring). The caller
    passes the time; nothing here reads a clock."""

    every_s: float = COALESCE_S
    _files: dict[tuple[str, str], _File] = field(default_factory=dict)

    def offer(self, arrival: Arrival, now: datetime) -> Due | None:
        """The event to write for `arrival` now, or None when it is held (counted in the next)."""
        key = (arrival.how, arrival.name)
        state = self._files.get(key)
        if state is None:
            self._files[key] = _File(now)
            return Due(arrival, 1, None)
        if (now - state.last_event).total_seconds() < self.every_s:
            state.held, state.versions = arrival, state.versions + 1
            return None
        due = Due(arrival, state.versions + 1, state.last_event)
        self._files[key] = _File(now)
        return due

    def flush(self) -> list[Due]:
        """The events of every held arrival, each the newest of its file. Everything is
        forgotten after: the next version of each file (a new run's) is an event at once."""
        due = [
            Due(state.held, state.versions, state.last_event)
            for state in self._files.values()
            if state.held is not None
        ]
        self._files.clear()
        return due
