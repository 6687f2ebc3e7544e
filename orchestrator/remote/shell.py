"""A person's own ssh to a node: the argv of `orch ssh` and the `Host` block of `orch ssh-config`.

Pure builders. Both use the cluster's key and a known_hosts file that pins the cluster's host
keys, and read no ssh configuration (`-F /dev/null`), so nothing of the user's `~/.ssh` applies
to a cloud node and nothing is written there. Agent and X11 forwarding and `LocalCommand` stay
off; port forwardings are exactly the `-L` ones asked for.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SpecError
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.node_home import in_home, jump_options, jump_parts
from orchestrator.remote.sync import ssh_option_path

_FORWARD = re.compile(
    r"^(?:(?P<bind>[0-9.]+|localhost):)?(?P<local>\d+):(?P<host>[^:\s]+):(?P<remote>\d+)$"
)

NO_FORWARDING = (
    "-o", "ForwardAgent=no",
    "-o", "ForwardX11=no",
    "-o", "PermitLocalCommand=no",
)  # fmt: skip


@dataclass(frozen=True)
class Forward:
    """`-L [BIND:]LOCAL:HOST:REMOTE`: this machine's LOCAL port reaches HOST:REMOTE as the node
    sees it (HOST `localhost` is the node itself)."""

    local_port: int
    host: str
    remote_port: int
    bind: str = "127.0.0.1"  # this machine's side listens on loopback unless told otherwise

    def option(self) -> str:
        return f"{self.bind}:{self.local_port}:{self.host}:{self.remote_port}"


def parse_forward(text: str) -> Forward:
    """`LOCAL:HOST:REMOTE` (or `BIND:LOCAL:HOST:REMOTE`) as ssh's `-L` takes it; ports 1-65535.
    Raises SpecError naming the flag and the expected form."""
    match = _FORWARD.match(text.strip())
    if match is None:
        raise SpecError(
            f"-L {text!r} is not a port forwarding",
            hint="give LOCAL:HOST:REMOTE, e.g. -L 6006:localhost:6006 for TensorBoard on the node",
        )
    local, remote = int(match["local"]), int(match["remote"])
    for name, port in (("local", local), ("remote", remote)):
        if not 1 <= port <= 65535:
            raise SpecError(f"-L {text!r}: the {name} port {port} is not between 1 and 65535")
    return Forward(local, match["host"], remote, match["bind"] or "127.0.0.1")


def _pinned(identity: Identity, known_hosts: Path) -> list[str]:
    return [
        "-o", f"IdentityFile={ssh_option_path(identity.private_key)}",
        "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={ssh_option_path(known_hosts)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
    ]  # fmt: skip


def shell_argv(
    address: HostAddress,
    identity: Identity,
    known_hosts: Path,
    *,
    command: Sequence[str] | str = (),
    forwards: Sequence[Forward] = (),
    connect_timeout: int = 15,
    tty: bool = False,
) -> list[str]:
    """`ssh` to one node: an interactive shell when `command` is empty, else `command` run
    there, its exit status passed through (255: ssh itself failed). A sequence is run with
    exactly these arguments (quoted for the node's shell); a string is a command line the
    node's shell reads as it is, as OpenSSH's `ssh HOST COMMAND` hands it over. With
    forwards, ssh fails at once if a port cannot be bound (`ExitOnForwardFailure`) rather
    than leaving a shell without its tunnel. `tty` asks for a terminal for `command` too (an
    interactive program run through another host).

    A node with its own home on a shared machine (`HostAddress.home`) gets the command, or the
    login shell, run there with HOME set to it (so a shell lands among the node's files, not
    the machine's); one with a `proxy_jump` is reached through it (`-J`)."""
    argv = [
        "ssh",
        "-F", "/dev/null",
        *NO_FORWARDING,
        *_pinned(identity, known_hosts),
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "ServerAliveInterval=15",
        "-o", "LogLevel=ERROR",
        "-p", str(address.port),
        "-l", address.user,
        *jump_options(address.proxy_jump),
    ]  # fmt: skip
    text = command if isinstance(command, str) else shlex.join(command)
    if address.home is not None:
        tty = tty or not text  # the login shell, started by the command: it needs a terminal
        text = in_home(text or 'exec "${SHELL:-/bin/sh}" -l', address.home)
    if forwards:
        argv += ["-o", "ExitOnForwardFailure=yes"]
        for forward in forwards:
            argv += ["-L", forward.option()]
    else:
        argv += ["-o", "ClearAllForwardings=yes"]
    if tty:
        argv.append("-t")
    argv.append(address.host)
    if text:
        argv += ["--", text]
    return argv


def _config_value(value: str) -> str:
    """A value for ssh_config: quoted when it has blanks (ssh_config's own quoting)."""
    if '"' in value or "\n" in value:
        raise SpecError(f"{value!r} cannot be written into an ssh_config file")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def ssh_config_block(
    alias: str, address: HostAddress, identity: Identity, known_hosts: Path
) -> str:
    """An OpenSSH `Host` block that reaches the node as `ssh ALIAS` (VS Code Remote, scp,
    rsync), with the same pinning and the same refusals as `orch ssh`, through its
    `proxy_jump` when it has one. It logs in as the login user, in the login's home: a node
    with a home of its own on a shared machine keeps its files in that folder."""
    lines = [
        f"Host {alias}",
        f"  HostName {address.host}",
        f"  Port {address.port}",
        f"  User {_config_value(address.user)}",
        f"  IdentityFile {_config_value(str(identity.private_key))}",
        "  IdentitiesOnly yes",
        "  StrictHostKeyChecking yes",
        f"  UserKnownHostsFile {_config_value(str(known_hosts))}",
        "  GlobalKnownHostsFile /dev/null",
        "  ForwardAgent no",
        "  ForwardX11 no",
        "  PermitLocalCommand no",
        "  ServerAliveInterval 15",
    ]
    if address.proxy_jump is not None:
        user, host, port = jump_parts(address.proxy_jump)
        lines.append(f"  ProxyJump {user}@{host}:{port}")
    return "\n".join(lines) + "\n"
