"""What a job holds of its checkpoints, in words: the newest directory checkpoint and the newest
version of each single file, with the step and the age of each. Pure: the callers (the SALVAGED
and SWITCHED events, the end of a foreground submit, `orch cancel`) pass ledger records.

A directory's step is the one its name gives (`step-000120`). A single file's step is the one
the run had reported when orch took the version (`CheckpointRecord.step`), which the file's
own contents may trail: it is said as "pulled at step N". The age counts from when orch
recorded the version (its copy reached the mirror or the store).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

NAMED_FILES = 3  # single files named one by one; the others are counted
DIRECTORY_KINDS = ("step", "dcp")  # the rest are named one by one (a kind of None: an older orch)


class KeptRecord(Protocol):
    """The fields of a ledger checkpoint record read here (`CheckpointRecord`, `CheckpointRow`)."""

    @property
    def id(self) -> int | None: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str | None: ...
    @property
    def step(self) -> int | None: ...
    @property
    def digest(self) -> str | None: ...
    @property
    def pulled_at(self) -> datetime: ...


@dataclass(frozen=True)
class Kept:
    """One checkpoint kept: its name, its step (see the module docstring), when it was
    recorded, and its kind (step | dcp | file; None: recorded by an older orch)."""

    name: str
    step: int | None
    at: datetime
    kind: str | None

    @property
    def directory(self) -> bool:
        return self.kind in DIRECTORY_KINDS

    def describe(self, now: datetime) -> str:
        """`step-000120 (step 120, 4 s old)`, `snapshot.pt (pulled at step 250, 12 s old)`."""
        age = f"{age_text((now - self.at).total_seconds())} old"
        if self.step is None:
            return f"{self.name} ({age})"
        step = f"pulled at step {self.step}" if self.kind == "file" else f"step {self.step}"
        return f"{self.name} ({step}, {age})"


def newest_kept(
    records: Iterable[KeptRecord], skip: Collection[tuple[str, str]] = ()
) -> list[Kept]:
    """The newest directory checkpoint (by step, then record id), then the newest version of
    each single file, newest first; a (name, digest) version in `skip` is left out. `records`
    are the job's live records (`Ledger.checkpoints(job, live_only=True)`)."""
    directory: KeptRecord | None = None
    files: dict[str, KeptRecord] = {}
    for record in records:
        if (record.name, record.digest) in skip:
            continue
        if record.kind in DIRECTORY_KINDS:
            if directory is None or _directory_order(record) > _directory_order(directory):
                directory = record
        elif (held := files.get(record.name)) is None or _order(record) > _order(held):
            files[record.name] = record
    chosen = [] if directory is None else [directory]
    chosen += sorted(files.values(), key=_order, reverse=True)
    return [Kept(r.name, r.step, r.pulled_at, r.kind) for r in chosen]


def describe_kept(kept: list[Kept], now: datetime) -> str:
    """The kept checkpoints in one phrase, e.g. `step-000120 (step 120, 4 s old) and
    snapshot.pt (pulled at step 250, 12 s old)`; `none` when there is none. Single files past
    the first `NAMED_FILES` are counted, not named."""
    if not kept:
        return "none"
    directories = [k for k in kept if k.directory]
    files = [k for k in kept if not k.directory]
    named = directories + files[:NAMED_FILES]
    parts = [k.describe(now) for k in named]
    if len(files) > NAMED_FILES:
        parts.append(f"{len(files) - NAMED_FILES} more file(s)")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def kept_phrase(kept: list[Kept], now: datetime) -> str:
    """`newest checkpoint snapshot.pt (pulled at step 250, 12 s old)`, `newest checkpoints A
    and B`, or `no checkpoint kept`: how events and summaries say what a job holds."""
    if not kept:
        return "no checkpoint kept"
    return f"newest checkpoint{'s' if len(kept) > 1 else ''} {describe_kept(kept, now)}"


def age_text(seconds: float) -> str:
    """`12 s`, `4 min`, `2.5 h`, `3.0 days`: a duration at the precision an age needs."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _order(record: KeptRecord) -> tuple[datetime, int]:
    return (record.pulled_at, record.id or 0)


def _directory_order(record: KeptRecord) -> tuple[int, int]:
    return (-1 if record.step is None else record.step, record.id or 0)
