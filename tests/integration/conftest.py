"""Fixtures of the integration tests: a moto EC2 server on 127.0.0.1 for the AWS provider,
a shared ledger's URL (`url`: a `sqlite:///` URL, then a PostgreSQL database), and two
machines on one shared ledger (`shared`, `tests.support.shared_homes`).

One `ThreadedMotoServer` per session (it starts in well under a second); each test that asks
for `moto_endpoint` gets it reset (`POST /moto-api/reset`) and fake credentials set in its own
environment only. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.shared_homes import Shared, shared_homes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Base URL of a moto server running in this process."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_endpoint(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The moto server, reset, with fake AWS credentials for this test only."""
    request = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=60) as reply:  # a loaded machine: seconds
        assert reply.status == 200
    for var in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    return moto_server


@pytest.fixture(params=["sqlite", "postgresql"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shared]:
    """Two homes on one ledger (a `sqlite:///` URL, then a PostgreSQL database) and one local
    root; every node and controller gone after."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with shared_homes(url, tmp_path) as homes:
        yield homes


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new shared ledger's URL: a SQLite file by URL, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return request.getfixturevalue("postgres_url")
