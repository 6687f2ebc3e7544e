"""Is the ledger consistent? SQLite's own integrity check plus the invariants orch relies on.

`check_ledger(path)` reads the SQLite file directly (plain sqlite3, read-only where the file
allows it, no schema changes), so it can judge a ledger left by a controller killed at any
line, or one written by an older orch. The invariants:

- `PRAGMA integrity_check` says ok and `PRAGMA foreign_key_check` finds nothing: every
  lease, event, checkpoint and GPU sample belongs to a job that exists;
- every job's state is a known one; a STOPPING job records the final state it leads to
  (`stop_state`, written in the same transaction, intent first);
- a job in a final state has an exit code, an end time, and no open lease;
- every lease has a parseable launch time and price >= 0, and an end time (if any) not
  before its launch; no instance has two open leases;
- times of a job are in order: created <= started <= ended (where set);
- with `watched` given: every open lease belongs to a job that is watched (its controller is
  alive), which is what "nothing leaks" means once a crashed controller has been dealt with.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

from orchestrator.job_state import FINAL_STATES, JobState

_KNOWN_STATES = {state.value for state in JobState}
_FINAL = {state.value for state in FINAL_STATES}


@dataclass(frozen=True)
class LedgerCheck:
    """The verdict on one ledger file."""

    integrity: list[str] = field(default_factory=list)  # what SQLite's checks found, if anything
    problems: list[str] = field(default_factory=list)  # broken invariants, one line each

    @property
    def ok(self) -> bool:
        return not self.integrity and not self.problems

    def __str__(self) -> str:
        if self.ok:
            return "ledger ok"
        lines = [f"integrity: {line}" for line in self.integrity] + self.problems
        return f"ledger inconsistent ({len(lines)} finding(s)):\n" + "\n".join(
            f"  {line}" for line in lines
        )


def check_ledger(path: Path | str, *, watched: Callable[[str], bool] | None = None) -> LedgerCheck:
    """Check the ledger file at `path` (see the module docstring for what is checked).

    `watched(job_id)` answers whether a live controller drives the job; when given, an open
    lease of an unwatched job is a problem. Raises FileNotFoundError when there is no file;
    never changes the file (a WAL left by a killed writer is replayed, as any reader would).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ledger at {path}")
    connection = _connect(path)
    try:
        integrity = _integrity(connection)
        problems: list[str] = []
        if not integrity:
            problems += _job_problems(connection)
            problems += _lease_problems(connection, watched)
        return LedgerCheck(integrity, problems)
    finally:
        connection.close()


def _connect(path: Path) -> sqlite3.Connection:
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        # A WAL ledger whose -shm file is gone must be opened read-write once to recover.
        connection = sqlite3.connect(path, timeout=30)
    connection.execute("PRAGMA busy_timeout=30000")
    return connection


def _integrity(connection: sqlite3.Connection) -> list[str]:
    found = [row[0] for row in connection.execute("PRAGMA integrity_check")]
    found = [] if found == ["ok"] else found
    for table, rowid, parent, _ in connection.execute("PRAGMA foreign_key_check"):
        found.append(f"{table} row {rowid} refers to a missing {parent}")
    return found


def _columns(connection: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in connection.execute(f'PRAGMA table_info("{table}")')}


def _time(value: object) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _job_problems(connection: sqlite3.Connection) -> list[str]:
    columns = _columns(connection, "job")
    if not columns:
        return []
    wanted = ["id", "state", "created_at", "started_at", "ended_at", "exit_code"]
    wanted.append("stop_state" if "stop_state" in columns else "NULL")
    problems = []
    for row in connection.execute(f"SELECT {', '.join(wanted)} FROM job ORDER BY id"):
        job_id, state, created, started, ended, exit_code, stop_state = row
        if state not in _KNOWN_STATES:
            problems.append(f"job {job_id}: unknown state {state!r}")
            continue
        if state == JobState.STOPPING and stop_state is None and "stop_state" in columns:
            problems.append(f"job {job_id}: STOPPING without the state it stops into")
        if state in _FINAL:
            if exit_code is None:
                problems.append(f"job {job_id}: {state} without an exit code")
            if ended is None:
                problems.append(f"job {job_id}: {state} without an end time")
        times = [(name, value, _time(value)) for name, value in
                 (("created", created), ("started", started), ("ended", ended))]  # fmt: skip
        for name, raw, parsed in times:
            if raw is not None and parsed is None:
                problems.append(f"job {job_id}: unreadable {name} time {raw!r}")
        ordered = [(name, parsed) for name, _, parsed in times if parsed is not None]
        for (first, a), (second, b) in zip(ordered, ordered[1:], strict=False):
            if b < a:
                problems.append(f"job {job_id}: {second} {b.isoformat()} before {first}")
    return problems


def _lease_problems(
    connection: sqlite3.Connection, watched: Callable[[str], bool] | None
) -> list[str]:
    if not _columns(connection, "lease"):
        return []
    states = dict(connection.execute("SELECT id, state FROM job"))
    problems = []
    open_by_instance: dict[str, list[int]] = {}
    query = (
        "SELECT id, job_id, instance_id, price_per_hour, launched_at, ended_at FROM lease "
        "ORDER BY id"
    )
    for lease_id, job_id, instance, price, launched, ended in connection.execute(query):
        where = f"lease {lease_id} ({instance} of job {job_id})"
        try:
            if Decimal(str(price)) < 0 or not Decimal(str(price)).is_finite():
                problems.append(f"{where}: price {price} is not a price")
        except InvalidOperation:
            problems.append(f"{where}: unreadable price {price!r}")
        start, end = _time(launched), _time(ended)
        if start is None:
            problems.append(f"{where}: unreadable launch time {launched!r}")
        if ended is not None and end is None:
            problems.append(f"{where}: unreadable end time {ended!r}")
        if start is not None and end is not None and end < start:
            problems.append(f"{where}: ended {end.isoformat()} before it was launched")
        if ended is not None:
            continue
        open_by_instance.setdefault(instance, []).append(lease_id)
        state = states.get(job_id)
        if state in _FINAL:
            problems.append(f"{where}: still open although the job is {state}")
        elif watched is not None and state is not None and not watched(job_id):
            problems.append(f"{where}: open, but no live controller watches job {job_id}")
    for instance, leases in sorted(open_by_instance.items()):
        if len(leases) > 1:
            problems.append(f"instance {instance}: {len(leases)} open leases {leases}")
    return problems
