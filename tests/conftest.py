"""What every test shares: settings, and the ledger, environment and home fixtures.

Hypothesis: a quarter of each property's examples (`tests.support.fuzzing`; all of them with
ORCH_FULL_FUZZ=1, as `make soak` runs), and no per-example deadline. The machines that run the
suite are shared and loaded; a property either holds or not, and how long one example took
says nothing about that.

Running `orch`, waiting and leak checks are plain functions in `tests/support/`.

What exists once per machine is taken in turns: an `orch sandbox aws` holds a machine-wide
lock, so tests that start one wait for each other (`tests.support.sandbox_run.sandbox_turn`),
also across pytest processes.

PostgreSQL: one real server per session (`postgres_server`, started by the first test that
asks for it, `tests.support.postgres`), and an empty database of it per test (`postgres_url`).
Without the server's binaries those tests fail with the command that installs them.

A browser: `browser`, a headless Chromium per test that reaches only loopback
(`tests.support.browser`; `open_browser` for one that may reach other addresses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.fuzzing import examples
from tests.support.helpers import fast_env
from tests.support.postgres import PostgresServer, PostgresUnavailable, start_server

if TYPE_CHECKING:
    from tests.support.browser import Browser

settings.register_profile(
    "orch",
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("orch")


@pytest.fixture
def orch_home(tmp_path: Path) -> Path:
    """A fresh ORCH_HOME for one test (created by orch itself on first use)."""
    return tmp_path / "orch"


@pytest.fixture
def orch_environment(orch_home: Path) -> dict[str, str]:
    """The environment of an `orch` process of this test: its own ORCH_HOME, nothing of the
    caller's ORCH_* variables, and the controller's checks at test speed."""
    return fast_env(orch_home)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    """A real SQLite ledger in the test's directory, disposed of afterwards."""
    engine = make_engine(tmp_path / "orch.db")
    yield Ledger(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test session, stopped (and its directory removed) at the
    end. Fails, never skips, where it cannot start: the message says what to install."""
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of an empty database of the session's PostgreSQL server, this test's own."""
    return postgres_server.fresh_database()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A headless Chromium of this test at desktop size (1366 x 900) that reaches only loopback
    (`tests.support.browser`); quit afterwards, with none of its processes left."""
    from tests.support.browser import open_browser

    with open_browser(tmp_path) as opened:
        yield opened
