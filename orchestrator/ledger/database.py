"""Which database holds the ledger, and the errors of reaching it.

The ledger lives in the SQLite file ORCH_HOME/orch.db unless `ledger.url` (config.yaml) or
ORCH_DATABASE_URL names another database as a SQLAlchemy URL. Two kinds are accepted:

    postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DATABASE   (psycopg 3; `postgresql://`
                                                                 and `postgres://` mean it too)
    sqlite:///PATH                                              (another SQLite file)

Nothing here imports SQLAlchemy before a URL is actually given.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError, OrchError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

EXAMPLE = "postgresql+psycopg://orch@db.example.com:5432/orch"
_SETTING = "ledger.url in ORCH_HOME/config.yaml, or ORCH_DATABASE_URL"
_POSTGRESQL_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg"}


class LedgerUrlError(ConfigError):
    """`ledger.url` / ORCH_DATABASE_URL is not a database the ledger can run on: nothing was
    opened. Fix the URL, or unset it to use the SQLite file under ORCH_HOME."""


class LedgerUnreachable(OrchError):
    """The ledger's database did not answer or refused the connection (server down, wrong
    host, port, user, password or database name): nothing was read or written."""


class LedgerTooNew(OrchError):
    """The ledger was migrated by a newer orch than this one: this orch does not know its
    schema and touched nothing. Upgrade orch."""


def masked(raw: str) -> str:
    """`raw` with any password in it replaced by ***, for messages."""
    return re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", raw)


def database_url(raw: str) -> URL:
    """The SQLAlchemy URL of `raw`, with PostgreSQL's driver made psycopg 3; raises
    LedgerUrlError when it is not a URL, or names a database or driver the ledger cannot use."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(raw.strip())
    except ArgumentError as exc:
        raise LedgerUrlError(
            f"the ledger URL {masked(raw)!r} is not a database URL",
            hint=f"set {_SETTING} to a URL such as {EXAMPLE}, or unset it for the SQLite file",
        ) from exc
    if url.drivername in ("sqlite", "sqlite+pysqlite"):
        return url
    if url.drivername in _POSTGRESQL_DRIVERS:
        if not url.host and not url.query.get("host"):
            raise LedgerUrlError(
                f"the ledger URL {masked(raw)!r} names no server",
                hint=f"give the PostgreSQL host, e.g. {EXAMPLE}",
            )
        return url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() in ("postgresql", "postgres"):
        raise LedgerUrlError(
            f"the ledger URL {masked(raw)!r} asks for the driver {url.get_driver_name()!r};"
            " orch talks to PostgreSQL through psycopg 3 only",
            hint=f"write it as postgresql+psycopg://..., e.g. {EXAMPLE}",
        )
    raise LedgerUrlError(
        f"the ledger URL {masked(raw)!r} names a {url.get_backend_name()} database;"
        " the ledger runs on PostgreSQL or SQLite",
        hint=f"set {_SETTING} to a PostgreSQL URL such as {EXAMPLE}, or unset it",
    )


def shown(url: URL) -> str:
    """`url` as messages show it: without its password."""
    return url.render_as_string(hide_password=True)


def unreachable(url: URL, exc: BaseException) -> LedgerUnreachable:
    """The error for a database at `url` that refused or did not answer a connection."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    if url.get_backend_name() == "sqlite":
        hint = "check that the ledger's directory exists and this user may write it"
    else:
        hint = (
            "start the database server, or fix the host, port, user, password or database"
            f" name in {_SETTING}; unset it to use the SQLite file under ORCH_HOME"
        )
    return LedgerUnreachable(
        f"cannot reach the ledger database {shown(url)}: {reason[0] if reason else exc}",
        hint=hint,
    )


def postgresql_engine(url: URL, **options: object) -> Engine:
    """A pool of psycopg 3 connections to `url`; a dropped connection (server restart) is
    replaced before use, and a server that does not answer fails the connect within 10 s.
    `options` go to `sqlalchemy.create_engine` (e.g. a `poolclass`)."""
    from sqlalchemy import create_engine

    connect_args: dict[str, object] = {"application_name": "orch"}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = 10
    try:
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **options)
    except ImportError as exc:
        raise LedgerUrlError(
            f"the ledger URL {shown(url)} needs psycopg 3, which is not installed ({exc})",
            hint="pip install 'psycopg[binary]>=3.1' (orch's own dependencies include it)",
        ) from exc
