"""Copies from one node to another over their private network: the one-time key, the shell
text that grants and revokes it on the nodes, and the rsync argv a sending node runs. Pure.

A transfer between nodes uses a key pair made for it alone (`one_time_key`). Its public key is
added to each receiving node's `~/.ssh/authorized_keys`, marked by the transfer's token; its
private key and a known_hosts file pinning the receivers' host keys go into a 0700 folder
`~/.orch-fanout-<token>` on each sending node. Afterwards (and when the transfer failed) the
marked line and the folder are removed (`revoke_script`, `disarm_script`). Nothing of the
user's own keys, nor the cluster's key, goes to a node.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import RemoteError
from orchestrator.remote.keys import HostAddress, known_hosts_text, new_key_pair
from orchestrator.remote.sync import (
    FAST_CIPHERS,
    LOW_PRIORITY_NICE,
    UNTRUSTED_HOST_OPTIONS,
    remote_path,
    rsync_argv,
    ssh_option_path,
)

KEY_DIR_PREFIX = ".orch-fanout-"
PARTIAL_DIR = ".orch-partial"
"""Where rsync keeps a file cut short by an interrupted transfer (a folder beside it, left out
of every transfer): the next run takes up from there, and no partial file ever sits under
its final name."""

PARTIAL_OPTIONS = (f"--partial-dir={PARTIAL_DIR}",)

_TOKEN_RE = re.compile(r"^[0-9a-f]{16}$")
_HOME_MAX = 1024


@dataclass(frozen=True)
class OneTimeKey:
    """A key pair for one transfer; `token` marks its authorized_keys line and key folder."""

    token: str
    private_pem: str  # OpenSSH private key, unencrypted (0600 on the senders)
    public_line: str  # "ssh-ed25519 AAAA... orch-fanout-<token>"

    @property
    def key_dir(self) -> str:
        """The key folder's name under a sending node's home."""
        return KEY_DIR_PREFIX + self.token


def one_time_key() -> OneTimeKey:
    """A fresh ed25519 key pair and its token, made in this process (no ssh-keygen)."""
    token = secrets.token_hex(8)
    private, public = new_key_pair()
    return OneTimeKey(token, private, f"{public} orch-fanout-{token}")


def _checked(token: str) -> str:
    if not _TOKEN_RE.match(token):
        raise ValueError(f"{token!r} is not a transfer token")
    return token


AUTHORIZED = '"$HOME/.ssh/authorized_keys"'


def authorize_script(key: OneTimeKey) -> str:
    """Shell text for a receiving node: append `key`'s public line, `restrict`ed, to its
    authorized_keys (created 0600 in a 0700 `~/.ssh` when missing; a last line without its
    newline gets one)."""
    line = shlex.quote(f"restrict {key.public_line}")  # a command only: no forwarding, no pty
    return (
        'umask 077 && mkdir -p "$HOME/.ssh" && touch ' + AUTHORIZED + " && "
        f'if [ -s {AUTHORIZED} ] && [ -n "$(tail -c 1 {AUTHORIZED})" ]; then '
        f"echo >> {AUTHORIZED}; fi && printf '%s\\n' {line} >> {AUTHORIZED}"
    )


def revoke_script(token: str) -> str:
    """Shell text for a receiving node: remove every authorized_keys line that carries the
    transfer's mark, in place (the file keeps its inode and mode); nothing when it has none."""
    mark = shlex.quote(f"orch-fanout-{_checked(token)}")
    tmp = '"$HOME/.ssh/.authorized_keys.orch-fanout"'
    return (
        f"[ -f {AUTHORIZED} ] || exit 0; grep -qF -- {mark} {AUTHORIZED} || exit 0; "
        f"umask 077 && {{ grep -vF -- {mark} {AUTHORIZED} > {tmp} || true; }} && "
        f"cat {tmp} > {AUTHORIZED} && rm -f {tmp}"
    )


def arm_script(key: OneTimeKey, receivers: Sequence[HostAddress]) -> str:
    """Shell text for a sending node: make `~/<key_dir>` (0700) holding `id` (the private
    key, read from standard input, 0600) and `known_hosts` pinning `receivers`; print $HOME."""
    folder = f'"$HOME/{key.key_dir}"'
    pins = shlex.quote(known_hosts_text(list(receivers)))
    return (
        f"umask 077 && rm -rf {folder} && mkdir -m 700 {folder} && cat > {folder}/id && "
        f"printf '%s' {pins} > {folder}/known_hosts && printf '%s' \"$HOME\""
    )


def disarm_script(token: str) -> str:
    """Shell text for a sending node: remove the transfer's key folder."""
    return f'rm -rf -- "$HOME/{KEY_DIR_PREFIX}{_checked(token)}"'


def node_home(said: str) -> str:
    """The home a sending node printed, checked before it goes into ssh options: an absolute
    path without control characters, quotes or `${`, of at most 1024 characters. A node is
    not trusted: anything else is refused."""
    if (
        not said.startswith("/")
        or len(said) > _HOME_MAX
        or any(ord(c) < 32 or c in "\"'\\\x7f" for c in said)
        or "${" in said
    ):
        raise RemoteError(f"a node reported an unusable home folder: {said[:80]!r}")
    return said.rstrip("/") or "/"


def node_transport(home: str, key: OneTimeKey, connect_timeout: int) -> list[str]:
    """The `ssh` a sending node's rsync runs: the one-time key and pinned known_hosts in its
    key folder, batch mode, no configuration file, nothing forwarded, AES-GCM first."""
    folder = f"{home}/{key.key_dir}"
    return [
        "ssh",
        "-F", "/dev/null",
        *UNTRUSTED_HOST_OPTIONS,
        "-o", f"IdentityFile={ssh_option_path(folder + '/id')}",
        "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={ssh_option_path(folder + '/known_hosts')}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "ServerAliveInterval=5",
        "-o", "LogLevel=ERROR",
        "-o", f"Ciphers={FAST_CIPHERS}",
    ]  # fmt: skip


def node_copy_argv(
    path: str,
    receiver: HostAddress,
    transport: Sequence[str],
    *,
    timeout_s: int | None = None,
    low_priority: bool = False,
) -> list[str]:
    """argv a sending node runs to copy its `path` (a file or a folder, `~/x`, relative or
    absolute) to the same path on `receiver` (its private address): into the path's parent,
    so a folder and a file are alike, with resumable partial files (`PARTIAL_DIR`).

    `timeout_s` ends it (and its ssh) on the node after that many seconds, so a transfer the
    controller gave up on does not run on; `low_priority` runs both ends under `nice`."""
    target = remote_path(path).rstrip("/") or "."
    if target in (".", "/"):
        raise ValueError(f"{path!r} names a home or root folder, not something to copy")
    parent = target.rsplit("/", 1)[0] + "/" if "/" in target else "./"
    host = f"[{receiver.host}]" if ":" in receiver.host else receiver.host
    transport = [*transport, "-p", str(receiver.port)]
    argv = rsync_argv(
        [target],
        f"{receiver.user}@{host}:{parent}",
        transport=transport,
        extra=[
            "--mkpath",
            *PARTIAL_OPTIONS,
            *([f"--rsync-path=nice -n {LOW_PRIORITY_NICE} rsync"] if low_priority else ()),
        ],
    )
    if low_priority:
        argv = ["nice", "-n", str(LOW_PRIORITY_NICE), *argv]
    if timeout_s is not None:
        argv = ["timeout", "-k", "5", str(max(1, timeout_s)), *argv]
    return argv
