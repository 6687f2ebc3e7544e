"""The ledger's clock: the one time every machine of a shared ledger judges leases by.

Controller leases (`ledger.controller_leases`) are taken, renewed and judged expired against
this clock, never against the clock of the machine asking, so machines whose clocks disagree
can neither take a live lease nor keep an expired one.

- PostgreSQL: the server's `clock_timestamp()`, the same clock for every client.
- SQLite: SQLite's own `'now'`, read by the process that opens the file. A SQLite ledger is
  shared by the ORCH_HOMEs of one host, which have one clock; a SQLite file on a network
  filesystem would be judged by each machine's clock (and its locks are not safe there):
  share a ledger across machines through PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection


def database_now(connection: Connection) -> datetime:
    """The database's current time (aware UTC), read on `connection`."""
    if connection.dialect.name == "postgresql":
        value = connection.execute(text("SELECT clock_timestamp()")).scalar_one()
        return value.astimezone(UTC)
    # SQLite: UTC, to the millisecond ('%f' is seconds with three decimals)
    value = connection.execute(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
    return datetime.fromisoformat(value).replace(tzinfo=UTC)
