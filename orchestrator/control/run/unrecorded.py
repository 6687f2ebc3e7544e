"""Ledger writes that must never keep nodes from ending, and the record of those that failed.

A stop, once decided, ends every node whatever the ledger does: a write that fails (disk full,
"database is locked" held past the busy timeout, a read-only file) is deferred, the nodes are
terminated, and the deferred writes are tried once more afterwards (`DeferredWrites`). What
still could not be written is saved as a small JSON file, `ORCH_HOME/unrecorded/<job>-*.json`
(`UnrecordedEnd`), and `finish_unrecorded` (run by `orch reconcile` and by every controller
before it drives a job) writes it into the ledger later: leases closed at the time the provider
acknowledged the end, the job's final state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from orchestrator.atomic import write_atomic
from orchestrator.errors import UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger

LEDGER_FAILURES: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)
"""What a ledger write raises when the database refuses it (locked, full, read-only, I/O)."""

UNRECORDED_DIR = "unrecorded"  # under ORCH_HOME


class DeferredWrites:
    """Best-effort ledger writes around a termination.

    `write(what, fn)` runs `fn` unless an earlier write failed; a failed write (one of
    `LEDGER_FAILURES`) is reported through `report` and kept, and once one failed every later
    write is kept without being tried, so a ledger that waits out its busy timeout on each
    write cannot hold the termination up. `retry()` tries the kept writes once more, in order.
    """

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report
        self.pending: list[tuple[str, Callable[[], object]]] = []
        self.error: BaseException | None = None  # the first failure

    def write(self, what: str, fn: Callable[[], object]) -> bool:
        """Run the write now (True) or keep it for `retry` (False). Never raises a ledger
        failure; other exceptions propagate."""
        if self.pending:
            self.pending.append((what, fn))
            return False
        try:
            fn()
        except LEDGER_FAILURES as exc:
            self.error = exc
            self.pending.append((what, fn))
            self.report(
                f"[orch] the ledger refused a write ({what}: {_short(exc)}); the nodes are "
                "ended first and the ledger is written again after"
            )
            return False
        return True

    def retry(self) -> list[str]:
        """Try each kept write once more, in order, stopping at the first that fails again
        (the ledger still refuses writes); returns what is still unwritten, reported."""
        while self.pending:
            what, fn = self.pending[0]
            try:
                fn()
            except LEDGER_FAILURES as exc:
                self.error = exc
                break
            self.pending.pop(0)
        left = [what for what, _ in self.pending]
        if left:
            self.report(
                f"[orch] the ledger still refuses writes ({_short(self.error)}): "
                f"{len(left)} record(s) not written: {'; '.join(left)}"
            )
        return left


def _short(exc: BaseException | None) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


@dataclass
class UnrecordedEnd:
    """What a stop did that the ledger did not take: nodes ended (ids, the provider's end
    time) and, when the job itself ended, its final state."""

    job_id: str
    ended: list[tuple[list[str], datetime]] = field(default_factory=list)
    state: JobState | None = None  # None: only nodes ended (orch down, reconcile)
    exit_code: int | None = None
    reason: str | None = None
    step: int | None = None
    ended_at: datetime | None = None

    def as_dict(self) -> dict:
        return {
            "version": 1,
            "job_id": self.job_id,
            "ended": [{"instance_ids": ids, "at": at.isoformat()} for ids, at in self.ended],
            "state": None if self.state is None else self.state.value,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "step": self.step,
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat(),
        }

    @classmethod
    def from_dict(cls, doc: dict) -> UnrecordedEnd:
        ended_at = doc.get("ended_at")
        return cls(
            job_id=doc["job_id"],
            ended=[
                (list(e["instance_ids"]), datetime.fromisoformat(e["at"])) for e in doc["ended"]
            ],
            state=None if doc.get("state") is None else JobState(doc["state"]),
            exit_code=doc.get("exit_code"),
            reason=doc.get("reason"),
            step=doc.get("step"),
            ended_at=None if ended_at is None else datetime.fromisoformat(ended_at),
        )


def save_unrecorded(home: Path, record: UnrecordedEnd) -> Path:
    """Write `record` atomically under ORCH_HOME/unrecorded/; returns the file."""
    directory = home / UNRECORDED_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record.job_id}-{time.time_ns()}.json"
    write_atomic(path, json.dumps(record.as_dict()), private=True)
    return path


def apply_unrecorded(ledger: Ledger, record: UnrecordedEnd) -> None:
    """Write what `record` holds: close the nodes' open leases at the provider's end times and
    end the job, unless it already reached a final state meanwhile. Idempotent."""
    for ids, at in record.ended:
        ledger.close_leases(ids, at)
    try:
        job = ledger.get_job(record.job_id)
    except UnknownJob:
        return  # nodes of a job the ledger never knew: no lease to close
    if record.state is None or JobState(job.state).is_final:
        return
    fields: dict[str, object] = {
        "state": record.state,
        "exit_code": record.exit_code,
        "reason": record.reason,
        "ended_at": record.ended_at,
        "stop_state": record.state.value,
    }
    if record.step is not None:
        fields["step"] = record.step
    ledger.update_job(record.job_id, **fields)
    ledger.add_event(
        record.job_id, record.state.value,
        f"{record.reason or ''} (recorded later: the ledger refused writes at the stop)".strip(),
        step=record.step,
    )  # fmt: skip


def has_unrecorded(home: Path, job_id: str) -> bool:
    """Whether a saved `UnrecordedEnd` of `job_id` waits to be written."""
    directory = home / UNRECORDED_DIR
    return directory.is_dir() and any(directory.glob(f"{job_id}-*.json"))


def finish_unrecorded(home: Path, ledger: Ledger, job_id: str | None = None) -> list[str]:
    """Write every saved `UnrecordedEnd` (only `job_id`'s, when given) into the ledger and
    remove its file; returns the job ids written. A file the ledger still refuses stays, for
    the next call; an unreadable file is left alone."""
    directory = home / UNRECORDED_DIR
    if not directory.is_dir():
        return []
    done: list[str] = []
    for path in sorted(directory.glob("*.json")):
        try:
            record = UnrecordedEnd.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if job_id is not None and record.job_id != job_id:
            continue
        try:
            apply_unrecorded(ledger, record)
        except LEDGER_FAILURES:
            continue
        path.unlink(missing_ok=True)
        done.append(record.job_id)
    return done
