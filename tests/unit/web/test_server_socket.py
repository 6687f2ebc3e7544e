"""The dashboard's listening socket: connections asyncio accepts on it send small answers at
once (Nagle off), so a browser's kept-alive connection does not wait out its own delayed ACK
(about 40 ms) on every answer after the first."""

from __future__ import annotations

import asyncio
import socket

import pytest

from orchestrator.errors import ConfigError
from orchestrator.web.server import bind_socket


def test_connections_accepted_on_the_dashboard_socket_have_nagle_off() -> None:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    class Record(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        server = await asyncio.get_running_loop().create_server(Record, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(accept_one())
    assert seen and seen[0] != 0


def test_a_taken_port_or_a_foreign_address_is_a_clear_error() -> None:
    taken = bind_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ConfigError, match="another program listens there"):
            bind_socket("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
    # an address of no interface here (TEST-NET-1): nothing is sent, the bind is refused
    with pytest.raises(ConfigError, match="an address of this machine"):
        bind_socket("192.0.2.1", 0)
