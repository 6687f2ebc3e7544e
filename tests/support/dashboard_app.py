"""The dashboard's app served by uvicorn in a thread of the test, on 127.0.0.1 and a free port:
real HTTP, without a process to start. `orch dashboard` itself is `dashboard_run.py`'s."""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchestrator.web.app import Dashboard
from orchestrator.web.server import bind_socket, make_server


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: str


@dataclass(frozen=True)
class Served:
    """A running dashboard: its base URL, and plain HTTP to it (no redirect followed)."""

    url: str

    def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                body: str | None = None) -> Reply:  # fmt: skip
        where = urlsplit(self.url)
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            text = response.read().decode("utf-8", "replace")
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, text)
        finally:
            connection.close()

    def get(self, path: str, **options: Any) -> Reply:
        return self.request("GET", path, **options)


@contextlib.contextmanager
def served(dashboard: Dashboard) -> Iterator[Served]:
    """Serve `dashboard` until the block ends; the server is stopped and joined after it."""
    sock = bind_socket("127.0.0.1", 0)
    ready = threading.Event()
    server = make_server(dashboard, ready=ready.set)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        if not ready.wait(30):
            raise AssertionError("the dashboard did not start within 30 s")
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the dashboard's server did not stop"
