"""Is an SSH server there yet? A TCP connect and the server's banner, nothing more.

Providers use it to tell "the machine runs" from "the machine can be logged into": a cloud
reports an instance as running before its sshd listens. It speaks no SSH (no key exchange, no
authentication): that is the SSH layer's job, and providers never use the SSH layer.
"""

from __future__ import annotations

import socket
import time

BANNER_PREFIX = b"SSH-"  # RFC 4253 4.2: the server's identification string starts so


def answers_ssh(host: str, port: int, *, timeout_s: float = 1.0) -> bool:
    """Whether a server accepts a TCP connection at host:port and sends an SSH banner within
    `timeout_s` (the connect, then the banner, each). Never raises: any failure is False."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            deadline = time.monotonic() + timeout_s
            received = b""
            while len(received) < len(BANNER_PREFIX):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
                chunk = sock.recv(len(BANNER_PREFIX) - len(received))
                if not chunk:
                    return False
                received += chunk
            return received == BANNER_PREFIX
    except OSError:
        return False
