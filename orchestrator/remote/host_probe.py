"""One command on a machine the user already has, with its host key pinned: how `orch fleet
add` learns what a machine is.

`probe` connects with the user's own key (`HostLogin.identity`, a path: read here, never
copied), checks the host key BEFORE it authenticates, so the key is never offered to an
impostor, runs one command and returns its output with the host key:

- with `known_hosts`, the host's entry there is the only key accepted (a host absent from the
  file, or presenting another key, is refused with `HostKeyMismatch`);
- without it, the key the host shows on first contact is returned for the caller to pin.

A `proxy_jump` ("user@addr[:port]") is reached first, with the same identity and the same
pinning rule, and the machine through it (an SSH `direct-tcpip` channel). Every failure is one
of three errors that names the machine and the reason: `HostUnreachable` (no answer, refused,
no route, timed out, or the command outlived `timeout`), `HostAuthFailed` (the key was refused
or cannot be read), `HostKeyMismatch`. The output read is bounded (`MAX_OUTPUT`).
"""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.errors import HostAuthFailed, HostKeyMismatch, HostUnreachable

MAX_OUTPUT = 256 * 1024  # bytes of the command's stdout kept; the rest is not read
CONNECT_TIMEOUT_S = 15.0  # a machine whose port does not answer within this is down


@dataclass(frozen=True)
class HostLogin:
    """How to log in to one machine of a fleet."""

    user: str
    address: str
    port: int
    identity: Path  # the user's private key
    proxy_jump: str | None = None  # "user@addr[:port]"
    known_hosts: Path | None = None  # pins the host key when given

    @property
    def name(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


@dataclass(frozen=True)
class Probed:
    host_key: str  # "ssh-ed25519 AAAA..."
    output: str  # the command's stdout (at most MAX_OUTPUT bytes, decoded with replacement)


def probe(login: HostLogin, command: str, timeout: float) -> Probed:
    """Run `command` on `login`'s machine within `timeout` seconds (connect included)."""
    deadline = time.monotonic() + timeout
    key = _private_key(login)
    jump = _jump_login(login) if login.proxy_jump else None
    opened: list[paramiko.Transport] = []
    try:
        if jump is not None:
            jump_transport = _session(jump, key, _connect(jump, deadline), deadline, opened)[0]
            sock: socket.socket | paramiko.Channel = _through(jump_transport, login, deadline)
        else:
            sock = _connect(login, deadline)
        transport, host_key = _session(login, key, sock, deadline, opened)
        return Probed(host_key, _run(transport, login, command, deadline))
    finally:
        for transport in reversed(opened):
            transport.close()


def _private_key(login: HostLogin) -> paramiko.PKey:
    try:
        return paramiko.PKey.from_path(login.identity)
    except paramiko.PasswordRequiredException as exc:
        raise HostAuthFailed(
            f"the identity {login.identity} is protected by a passphrase",
            hint="give a key without a passphrase (orch logs in without a terminal)",
        ) from exc
    except (OSError, ValueError, paramiko.SSHException) as exc:
        raise HostAuthFailed(
            f"cannot read the identity {login.identity}: {exc}",
            hint="give the path of an OpenSSH private key (--identity)",
        ) from exc


def _jump_login(login: HostLogin) -> HostLogin:
    assert login.proxy_jump is not None
    user, _, rest = login.proxy_jump.rpartition("@")
    address, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "22")
    return HostLogin(
        user or login.user, address, int(port or 22), login.identity, None, login.known_hosts
    )


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _connect(login: HostLogin, deadline: float) -> socket.socket:
    try:
        wait = min(CONNECT_TIMEOUT_S, _left(deadline))
        return socket.create_connection((login.address, login.port), timeout=wait)
    except TimeoutError as exc:
        raise _unreachable(login, "no answer (timed out)") from exc
    except socket.gaierror as exc:
        raise _unreachable(login, f"the name does not resolve ({exc.strerror})") from exc
    except ConnectionRefusedError as exc:
        reason = f"connection refused: nothing listens on port {login.port}"
        raise _unreachable(login, reason) from exc
    except OSError as exc:
        reason = "no route to host" if exc.errno == errno.EHOSTUNREACH else str(exc)
        raise _unreachable(login, reason) from exc


def _through(jump: paramiko.Transport, login: HostLogin, deadline: float) -> paramiko.Channel:
    try:
        return jump.open_channel(
            "direct-tcpip", (login.address, login.port), ("127.0.0.1", 0), timeout=_left(deadline)
        )
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise _unreachable(login, f"the jump host could not reach it ({exc})") from exc


def _session(
    login: HostLogin,
    key: paramiko.PKey,
    sock: socket.socket | paramiko.Channel,
    deadline: float,
    opened: list[paramiko.Transport],
) -> tuple[paramiko.Transport, str]:
    """An authenticated transport over `sock`, and the host key it showed (checked first)."""
    pinned = _pinned_keys(login)
    transport = paramiko.Transport(sock)
    opened.append(transport)
    transport.banner_timeout = transport.handshake_timeout = transport.auth_timeout = _left(
        deadline
    )
    if pinned:  # ask for the pinned key's type first, as OpenSSH does
        options = transport.get_security_options()
        wanted = [t for t in pinned if t in options.key_types]
        options.key_types = wanted + [t for t in options.key_types if t not in wanted]
    try:
        transport.start_client(timeout=_left(deadline))
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise _unreachable(login, f"no SSH handshake ({exc or type(exc).__name__})") from exc
    shown = transport.get_remote_server_key()
    host_key = f"{shown.get_name()} {shown.get_base64()}"
    if pinned is not None and pinned.get(shown.get_name()) != shown.get_base64():
        raise HostKeyMismatch(
            f"{login.name} presented the host key {host_key[:40]}..., which "
            f"{login.known_hosts} does not list for {login.known_hosts_name}; refused",
            hint="check that this is the machine you mean; if its key changed on purpose, "
            "update the known_hosts file (ssh-keyscan) and add the fleet again",
        )
    try:
        transport.auth_publickey(login.user, key)
    except paramiko.AuthenticationException as exc:
        raise HostAuthFailed(
            f"{login.name} refused the identity {login.identity} for user {login.user}",
            hint=f"add its public key ({login.identity}.pub) to ~{login.user}/.ssh/"
            "authorized_keys on that machine, or give the right --identity",
        ) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise _unreachable(login, f"the login did not finish ({exc})") from exc
    return transport, host_key


def _pinned_keys(login: HostLogin) -> dict[str, str] | None:
    """Key type -> base64 of `login`'s entries in its known_hosts; None without a file."""
    if login.known_hosts is None:
        return None
    try:
        known = paramiko.HostKeys(str(login.known_hosts))
    except (OSError, paramiko.SSHException) as exc:
        raise HostKeyMismatch(
            f"cannot read the known_hosts file {login.known_hosts}: {exc}",
            hint="give a readable OpenSSH known_hosts file (--known-hosts)",
        ) from exc
    entry = known.lookup(login.known_hosts_name)
    if not entry:
        raise HostKeyMismatch(
            f"{login.known_hosts} has no host key for {login.known_hosts_name}; "
            f"{login.name} is refused rather than trusted unseen",
            hint=f"add its key (ssh-keyscan -p {login.port} {login.address}) to the file, "
            "or leave out --known-hosts to pin the key it shows now",
        )
    return {key_type: entry[key_type].get_base64() for key_type in entry}


def _run(transport: paramiko.Transport, login: HostLogin, command: str, deadline: float) -> str:
    try:
        channel = transport.open_session(timeout=_left(deadline))
        channel.settimeout(0.2)
        channel.exec_command(command)
        out = bytearray()
        while True:
            try:
                chunk = channel.recv(65536)
            except TimeoutError:
                chunk = None
            if chunk == b"":
                break
            if chunk:
                out += chunk[: MAX_OUTPUT - len(out)]
                if len(out) >= MAX_OUTPUT:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError
        return out.decode(errors="replace")
    except TimeoutError as exc:
        raise _unreachable(login, "the probe did not finish in time") from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise _unreachable(login, f"the connection broke ({exc})") from exc


def _unreachable(login: HostLogin, reason: str) -> HostUnreachable:
    return HostUnreachable(
        f"cannot reach {login.name}: {reason}",
        hint="check that the machine is up, its address and port, and that sshd runs there",
    )
