"""Bringing a ledger to this orch's schema when it is opened (Alembic revisions).

Contract (`upgrade`, which `store.make_engine` calls on every open):
- At head already: one query (`alembic_version`), no lock, Alembic not even imported. This is
  the path of every command but the first after an orch upgrade.
- Otherwise, under a lock held across processes, the ledger is read again and upgraded to
  `HEAD`: a brand-new database gets every revision from the baseline on; a ledger made before
  migrations (tables but no `alembic_version`) is first brought to the baseline's schema in
  place (missing tables created, missing columns added with their defaults; rows kept),
  stamped with the baseline, then upgraded like any other.
- The lock: on SQLite a lock file beside the database (never the database itself); on
  PostgreSQL a transaction-level advisory lock, taken in the transaction that migrates, so
  that commands opening one new ledger at once wait for the first and then find it at head.
- An upgrade is one transaction on both (SQLite's DDL too, in `BEGIN IMMEDIATE`): a process
  killed during it leaves the ledger as it was. A new SQLite ledger is built beside its path
  and renamed into place (`create_sqlite`): there is never a ledger file without its tables.
- A ledger stamped with a revision this orch does not know was migrated by a newer orch:
  LedgerTooNew, nothing touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from orchestrator.atomic import install
from orchestrator.ledger.database import LedgerTooNew, unreachable
from orchestrator.ledger.migrations import BASELINE, HEAD, SCRIPTS

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "alembic_version"
# The PostgreSQL advisory lock key of the ledger's migrations (a fixed 64-bit number).
LOCK_KEY = int.from_bytes(
    hashlib.blake2b(b"orch ledger migrations", digest_size=8).digest(), "big", signed=True
)
_LEGACY_STAMP = "schema"  # ledger_meta key of the schema digest the ledgers before migrations kept


def stamped_revision(engine: Engine) -> str | None:
    """The revision the ledger is stamped with, in one query; None when it has none (a new
    database, or a ledger made before migrations). LedgerUnreachable when the database cannot
    be connected to."""
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        raise unreachable(engine.url, exc) from exc
    with connection:
        try:
            return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
        except DBAPIError:  # no such table yet
            return None


def upgrade(engine: Engine, *, lock_file: Path | None) -> None:
    """Bring the ledger of `engine` to `HEAD` (see the module's contract). `lock_file` is the
    SQLite database's lock file; None for PostgreSQL and in-memory databases."""
    if stamped_revision(engine) == HEAD:
        return
    with _file_lock(lock_file), engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
        elif connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")  # DDL included; the driver would not
        _upgrade(connection)


def create_sqlite(path: Path, *, lock_file: Path) -> None:
    """Make a new SQLite ledger at `path`, at `HEAD`, whole or not at all: it is built in a
    file beside `path` and renamed onto it, so a process killed meanwhile leaves no ledger
    behind rather than one without tables. Under the lock; nothing to do when another process
    made it first. Leftovers of a builder killed before are removed."""
    with _file_lock(lock_file):
        if path.exists():
            return
        for leftover in path.parent.glob(f".{path.name}.new-*"):
            leftover.unlink(missing_ok=True)
        building = path.with_name(f".{path.name}.new-{os.getpid()}")
        # A rollback journal while it is built (WAL, set on every connection of the ledger,
        # starts once it is in place): the file alone holds it when it is renamed.
        engine = create_engine(URL.create("sqlite", database=str(building)))
        try:
            with engine.begin() as connection:
                _upgrade(connection)
        finally:
            engine.dispose()
        # WAL is recorded in the file itself, and its log goes when the last connection closes:
        # the ledger arrives in WAL mode, so the commands that open it at once never race to
        # switch it (a switch needs the file to itself, and SQLite answers "database is locked"
        # without waiting when another connection holds it).
        with contextlib.closing(sqlite3.connect(building)) as switch:
            switch.execute("PRAGMA journal_mode=WAL")
        install(building, path)


def current_revision(connection: Connection) -> str | None:
    """The revision stamped in the ledger on `connection`, read without failing the
    transaction when there is no version table."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def alembic_config(connection: Connection) -> Config:
    """Alembic's configuration for the ledger's scripts, run on `connection` (no .ini file)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    revision = current_revision(connection)
    if revision == HEAD:
        return  # another process did it while this one waited for the lock
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    config = alembic_config(connection)
    if revision is not None:
        try:
            ScriptDirectory.from_config(config).get_revision(revision)
        except CommandError as exc:
            raise LedgerTooNew(
                f"the ledger is at schema revision {revision!r}, which this orch does not know"
                f" (it knows up to {HEAD!r}): a newer orch has migrated it",
                hint="upgrade orch to the release the other machines use",
            ) from exc
    elif _holds_ledger_tables(connection):
        adopt_legacy(connection)
        command.stamp(config, BASELINE)
    command.upgrade(config, "head")


def _holds_ledger_tables(connection: Connection) -> bool:
    from orchestrator.ledger.migrations.baseline import baseline_metadata

    present = set(inspect(connection).get_table_names())
    return any(name in present for name in baseline_metadata().tables)


def adopt_legacy(connection: Connection) -> None:
    """Bring a ledger made before migrations to the baseline's schema, in place: its missing
    tables and indexes are created and its missing columns added (NOT NULL only where the
    baseline gives a default for the rows already there); no row changes. The digest stamp
    those ledgers kept in `ledger_meta` is dropped: the revision replaces it."""
    from orchestrator.ledger.migrations.baseline import baseline_metadata

    inspector = inspect(connection)
    present = set(inspector.get_table_names())
    for table in baseline_metadata().sorted_tables:
        if table.name not in present:
            table.create(connection)
            continue
        columns = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in columns:
                continue
            kind = column.type.compile(dialect=connection.dialect)
            default = column.default.arg if column.default is not None else None  # type: ignore[attr-defined]
            clause = "" if default is None else f" DEFAULT {_literal(default)}"
            if default is not None and not column.nullable:
                clause += " NOT NULL"
            connection.execute(
                text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}{clause}')
            )
        for index in table.indexes:
            index.create(connection, checkfirst=True)
    connection.execute(text("DELETE FROM ledger_meta WHERE key = :key"), {"key": _LEGACY_STAMP})


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


@contextlib.contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    """Held while a SQLite ledger is migrated: commands started at once on a new ORCH_HOME
    would otherwise each find a table missing and all but one fail creating it. A file beside
    the ledger, never the ledger itself: closing a descriptor of the database would drop
    SQLite's own locks in this process."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
