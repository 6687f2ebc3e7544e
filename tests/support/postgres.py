"""A real PostgreSQL server for the tests: Debian's `postgresql` binaries, started with initdb
and pg_ctl in a temporary directory, on a free port of 127.0.0.1 (and a socket in that
directory), once per test session.

PostgreSQL refuses to run as root, and the tests run as root: then the server runs as the
unprivileged user `nobody`, which owns the directory. The server is tuned for tests (no fsync)
and trusts every local connection. Each test takes a database of its own (`fresh_database`),
so tests never see each other's rows.

Missing binaries fail the test that needs them with the command that installs them; nothing
is skipped.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

INSTALL = "apt-get install -y postgresql  (as root; `make setup` does it)"
SERVER_USER = "nobody"  # who runs the server when the tests run as root
SUPERUSER = "postgres"  # the server's own superuser role (initdb -U)


class PostgresUnavailable(RuntimeError):
    """The server cannot be started here; the message says what to install or look at."""


def server_binaries() -> Path:
    """The bin directory of the newest PostgreSQL under /usr/lib/postgresql/*/bin."""
    found = sorted(
        (Path(path).parent for path in glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")),
        key=lambda bin_dir: _version(bin_dir.parent.name),
    )
    if not found or not (found[-1] / "initdb").exists():
        raise PostgresUnavailable(
            f"no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: {INSTALL}"
        )
    return found[-1]


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class PostgresServer:
    """One running server; `url(database)` is what orch's `ledger.url` takes."""

    root: Path
    port: int
    bin_dir: Path
    _user: str | None  # runs the server's commands; None: this process's own user
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self, prefix: str = "orch") -> str:
        """Create an empty database of the server; its URL."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        dsn = f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server at once and remove its directory."""
        try:
            _run(self._user, [self.bin_dir / "pg_ctl", "-D", self.data, "-m", "immediate", "stop"])
        except PostgresUnavailable:
            pass  # stopped already: the directory goes anyway
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _run(user: str | None, argv: list[object], timeout: float = 120) -> str:
    command = [str(part) for part in argv]
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd="/")
    if done.returncode != 0:
        raise PostgresUnavailable(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def start_server(attempts: int = 3) -> PostgresServer:
    """initdb and start a server in a new temporary directory (see the module docstring);
    PostgresUnavailable, with what to do, when it cannot start."""
    bin_dir = server_binaries()
    user = SERVER_USER if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="orch-postgres-"))
    if user is not None:
        account = pwd.getpwnam(user)
        os.chown(root, account.pw_uid, account.pw_gid)
    os.chmod(root, 0o700)
    try:
        _run(
            user,
            [bin_dir / "initdb", "-D", root / "data", "-U", SUPERUSER, "-A", "trust",
             "-E", "UTF8", "--locale=C", "--no-sync"],
        )  # fmt: skip
        for attempt in range(attempts):
            port = _free_port()
            options = (
                f"-p {port} -h 127.0.0.1 -k {root} -c fsync=off -c synchronous_commit=off"
                " -c full_page_writes=off -c max_connections=200"
            )
            try:
                _run(
                    user,
                    [bin_dir / "pg_ctl", "-D", root / "data", "-l", root / "server.log",
                     "-w", "-t", "60", "-o", options, "start"],
                )  # fmt: skip
                return PostgresServer(root, port, bin_dir, user)
            except PostgresUnavailable:
                if attempt == attempts - 1:  # the port was taken meanwhile, or worse
                    log = root / "server.log"
                    raise PostgresUnavailable(
                        f"the PostgreSQL server did not start:\n"
                        f"{log.read_text() if log.exists() else '(no log)'}"
                    ) from None
        raise AssertionError("unreachable")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
