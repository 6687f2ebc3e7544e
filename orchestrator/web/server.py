"""Serve the dashboard with uvicorn on a socket bound before anything is announced, so a port
in use is reported as such and the printed address already answers."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError
from orchestrator.web.app import Dashboard, create_app

if TYPE_CHECKING:
    from types import FrameType

    import uvicorn


def bind_socket(address: str, port: int) -> socket.socket:
    """A listening TCP socket on `address`:`port` (0: any free port); ConfigError when the
    address is not this machine's or the port is taken."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(
            f"--bind {address}: {exc.strerror}",
            hint="give an IP address of this machine, e.g. 127.0.0.1",
        ) from exc
    family, _, proto, _, where = infos[0]
    # With the protocol named (TCP), asyncio turns Nagle off on every accepted connection; a
    # socket made with proto 0 keeps it on, and a kept-alive connection then waits out the
    # client's delayed ACK (40 ms) on every answer after its first.
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(where)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = (
            "another program listens there: choose another --port"
            if exc.errno == 98
            else "--bind takes an address of this machine"
        )
        raise ConfigError(
            f"cannot serve on {address}:{port}: {exc.strerror or exc}", hint=hint
        ) from exc
    sock.set_inheritable(True)
    return sock


def make_server(dashboard: Dashboard, *, ready: Callable[[], None]) -> uvicorn.Server:
    """A uvicorn server of `dashboard`'s app; `ready` is called once it accepts connections.
    `run(sockets=[...])` answers until SIGINT or SIGTERM (in the main thread) or until its
    `should_exit` is set."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                ready()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # SIGINT and SIGTERM are how a dashboard is meant to stop: shut down and return,
            # without uvicorn's raising the signal again afterwards (exit code 0, not 130).
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: do not wait for open connections
            self.should_exit = True

    config = uvicorn.Config(
        create_app(dashboard),
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        proxy_headers=False,
    )
    return Server(config)


def serve(dashboard: Dashboard, sock: socket.socket, *, ready: Callable[[], None]) -> None:
    """Answer on `sock` until SIGINT or SIGTERM, then return."""
    make_server(dashboard, ready=ready).run(sockets=[sock])
