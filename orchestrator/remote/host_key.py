"""Learn the host key an SSH server presents, for adopting a host orch did not launch.

Trust on first use: `scan_host_key` returns whatever key the server presents; the caller pins
it (known_hosts), and every later connection refuses any other key (`HostKeyMismatch`).
"""

from __future__ import annotations

import socket

import paramiko

from orchestrator.errors import NodeUnreachable


def scan_host_key(host: str, port: int, *, timeout: float = 10.0) -> str:
    """The server's host key as an OpenSSH line ("ssh-ed25519 AAAA..."); no login is tried.

    Raises `NodeUnreachable` when nothing answers SSH at `host:port` within `timeout`.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            transport = paramiko.Transport(sock)
            try:
                transport.banner_timeout = timeout
                transport.start_client(timeout=timeout)
                key = transport.get_remote_server_key()
                return f"{key.get_name()} {key.get_base64()}"
            finally:
                transport.close()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise NodeUnreachable(
            f"no SSH server answered at {host}:{port}: {exc}",
            hint="check the address and port, and that sshd runs there",
        ) from exc
