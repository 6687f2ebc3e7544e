"""One submit at a time through the monthly caps, across every process and machine of a ledger.

Admitting a job under `budget.monthly_usd` reads what is left and then records the job's
reservation. Two submits doing that at once would both see the same room and both fit, and
together pass the cap. `admission_lock` makes the read and the record one step:

- PostgreSQL: a session advisory lock of the ledger's database, held on its own connection,
  so every machine sharing the database waits for the submit ahead of it.
- SQLite: an exclusive file lock beside the database file (the same file for every
  ORCH_HOME whose `ledger.url` names it).

The lock is held only while a submit checks and registers (milliseconds); nothing is launched
under it. A process killed while holding it lets go with its connection or file descriptor.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from orchestrator.ledger.types import POSTGRESQL

# The PostgreSQL advisory lock key of admissions (a fixed 64-bit number).
ADMISSION_KEY = int.from_bytes(
    hashlib.blake2b(b"orch ledger admission", digest_size=8).digest(), "big", signed=True
)


def admission_lock_file(engine: Engine) -> Path | None:
    """The lock file of a SQLite ledger (beside its database file); None for an in-memory
    database or another engine."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return None
    return Path(database).with_name(Path(database).name + ".admission.lock")


@contextlib.contextmanager
def admission_lock(engine: Engine) -> Iterator[None]:
    """Hold the ledger's admission lock for the body (waiting for whoever holds it)."""
    if engine.dialect.name == POSTGRESQL:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADMISSION_KEY})
            connection.commit()
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADMISSION_KEY})
                connection.commit()
        return
    path = admission_lock_file(engine)
    if path is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
