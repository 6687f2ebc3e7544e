"""A node that is an allocation on a shared machine: its own home, and the host it is reached
through. Pure builders of the shell text and ssh options that put every command and copy there.

A machine the user already has may hold several nodes (one per job) under one login. Each such
node has a home of its own (`HostAddress.home`, an absolute path on the machine): every command
runs with `HOME` exported to it and in it, and rsync resolves relative and `~/` paths under it,
so `~/ckpt`, `orch-jobs/...` and the guard land there and two jobs never see each other's files.
A node without one is the whole machine: its commands run as sshd starts them.
"""

from __future__ import annotations

import re
import shlex

from orchestrator.errors import ConfigError

_JUMP = re.compile(
    r"^(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]{0,63})@"
    r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)
NO_HOME_EXIT = 1  # a command whose node home cannot be made or entered exits so, saying why


def checked_home(home: str) -> str:
    """`home` when it is an absolute path that a shell word and an rsync path can carry;
    ConfigError otherwise."""
    if not home.startswith("/") or any(c in home for c in "\0\n\r") or len(home) > 1024:
        raise ConfigError(
            f"node home {home[:80]!r} is not an absolute path on one line",
            hint="a node's home is the absolute folder of its allocation on the machine",
        )
    return home


def enter_home(home: str) -> str:
    """Shell text that exports HOME=`home`, makes it (0700, with any missing parent) and
    enters it; on failure it says so on stderr and exits `NO_HOME_EXIT`. The umask is set in
    a subshell only: the command's own files get the login's."""
    quoted = shlex.quote(checked_home(home))
    said = shlex.quote(f"orch: cannot make or enter the node home {home}")
    return (
        f'export HOME={quoted} && (umask 077 && mkdir -p -- "$HOME") && cd -- "$HOME" '
        f"|| {{ echo {said} >&2; exit {NO_HOME_EXIT}; }}"
    )


def in_home(command: str, home: str | None) -> str:
    """`command` (a shell command line) as it runs on a node with `home`: after `enter_home`,
    in the same shell (so `exit`, `cd` and variables behave as without it). Unchanged when
    `home` is None."""
    if home is None:
        return command
    return f"{enter_home(home)}\n{command}"


def rsync_path(home: str | None, *, nice: int | None = None) -> str | None:
    """The `--rsync-path` value that runs the node's rsync in `home` with HOME set to it (so
    relative and `~/` paths resolve there, and the guard counts the copy as the job's), under
    `nice -n NICE` when given. None when neither is needed (rsync's own default)."""
    program = "rsync" if nice is None else f"nice -n {int(nice)} rsync"
    if home is None:
        return None if nice is None else program
    quoted = shlex.quote(checked_home(home))
    made = f"(umask 077 && mkdir -p -- {quoted})"
    return f"export HOME={quoted} && {made} && cd -- {quoted} && {program}"


def jump_parts(proxy_jump: str) -> tuple[str, str, int]:
    """(user, host, port) of a `user@addr[:port]` jump host (port 22 when not given; an IPv6
    address in brackets); ConfigError for anything else, so no option or shell word can
    come in through it."""
    found = _JUMP.match(proxy_jump)
    port = int(found["port"]) if found is not None and found["port"] else 22
    if found is None or not 1 <= port <= 65535:
        raise ConfigError(
            f"proxy jump {proxy_jump[:80]!r} is not USER@ADDR[:PORT]",
            hint="give the jump host as user@address, optionally :port",
        )
    return found["user"], found["host"], port


def jump_options(proxy_jump: str | None) -> list[str]:
    """`ssh -J USER@ADDR[:PORT]` for a node reached through a jump host; [] without one. The
    jump host is reached as the user's own `ssh -J` reaches it (their keys, agent and
    known_hosts: `-J` hands none of the node's options on); the node's own host key is still
    the pinned one, end to end."""
    if proxy_jump is None:
        return []
    user, host, port = jump_parts(proxy_jump)
    return ["-J", f"{user}@{host}:{port}"]


def jump_command(proxy_jump: str, connect_timeout: int) -> str:
    """The proxy command that `ssh -J` runs for the jump (its `-W` to the node), in batch mode
    and with nothing forwarded, for a connection that is not OpenSSH's own (paramiko's):
    `%h` and `%p` are the node's address and port."""
    user, host, port = jump_parts(proxy_jump)
    return shlex.join(
        [
            "ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ForwardAgent=no",
            "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes",
            "-o", f"ConnectTimeout={int(connect_timeout)}", "-l", user, "-p", str(port),
            "-W", "[%h]:%p", host.strip("[]"),
        ]
    )  # fmt: skip
