"""The fleet's own hands on its hosts: what orch does there as the user's login, with the
fleet's identity (the user's key, never copied), before a job's key can log in and after it no
longer may.

- `prepare` makes an allocation: its home, the job key's line in authorized_keys, the node
  runtime (from the host's cache when it holds this version), the guard's terms, and the
  guard started. Raises `NodeUnreachable` when the host does not answer.
- `end` ends one: every process of the login whose HOME is the allocation's, the key's line
  and the allocation's folder (`allocation-end`, the node program). Never the machine: its
  sshd and everything orch did not start stay. Idempotent.
- `answers` says whether the host's sshd answers at all (a health check).

The fleet's provider is the one provider that talks SSH: a fleet's "cloud" is its machines'
sshd, and nothing else can start or end an allocation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.node import runtime
from orchestrator.node.guard_protocol import GuardLayout
from orchestrator.providers.ssh.allocation import (
    CACHE_DIR,
    FLEET_DIR,
    allocation_home,
    authorized_line,
    detached,
    ending_command,
    guard_boot,
    interface_script,
    is_instance_id,
    login_home,
    prepare_script,
)
from orchestrator.providers.ssh_banner import answers_ssh
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.ssh import NodeConnection

PREPARE_TIMEOUT_S = 60.0
END_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FleetLogin:
    """How orch reaches one fleet host as the user: its address, pinned key and the fleet's
    identity file."""

    label: str  # for messages: "fleet gpu-lab host 0 (root@10.0.0.5:22)"
    user: str
    address: str
    port: int
    host_key: str
    identity: Path  # the user's private key, as `orch fleet add --identity` named it
    state_dir: Path  # ORCH_HOME's folder for this fleet (known_hosts, control sockets)
    proxy_jump: str | None = None


@dataclass(frozen=True)
class Prepared:
    home: str  # the allocation's home on the host
    login_home: str  # the login's own home there
    interface: str  # the interface carrying the host's address ("" when none does)
    runtime_path: str  # the node runtime the allocation's guard and end run from


def _connection(login: FleetLogin, *, timeout: float) -> NodeConnection:
    login.state_dir.mkdir(parents=True, exist_ok=True)
    known = login.state_dir / "known_hosts"
    known.touch(mode=0o600, exist_ok=True)
    control = login.state_dir / "ssh"
    control.mkdir(mode=0o700, exist_ok=True)
    address = HostAddress(
        name=login.label,
        host=login.address,
        port=login.port,
        user=login.user,
        host_key=login.host_key,
        proxy_jump=login.proxy_jump,
    )
    identity = Identity(login.identity, "", known, control)
    return NodeConnection(
        address, identity, connect_timeout=min(10.0, timeout), command_timeout=timeout
    )


def answers(login: FleetLogin, timeout: float = 3.0) -> bool:
    """Whether the host's sshd answers with its banner within `timeout` (no login)."""
    if login.proxy_jump:
        try:
            connection = _connection(login, timeout=timeout)
            try:
                return connection.run("true", timeout=timeout, check=False).ok
            finally:
                connection.close()
        except Exception:  # noqa: BLE001 - any failure to log in through the jump is "no"
            return False
    return answers_ssh(login.address, login.port, timeout_s=timeout)


def prepare(
    login: FleetLogin,
    instance_id: str,
    public_key: str,
    terms_for: Callable[[str, str], str] | None,
) -> Prepared:
    """Make the allocation `instance_id` on the host and start its guard, whose terms
    document `terms_for(home, poweroff)` writes once the allocation's home and end command are
    known (None: no guard). Raises `NodeUnreachable` when the host does not answer, and
    `RemoteError` when a step fails there."""
    connection = _connection(login, timeout=PREPARE_TIMEOUT_S)
    try:
        said = connection.run(
            prepare_script(instance_id, authorized_line(public_key, instance_id)),
            max_output=64 * 1024,
        )
        home_of_login = login_home(said.stdout)
        home = allocation_home(home_of_login, instance_id)
        runtime_path = _place_runtime(connection, home_of_login, home)
        interface = connection.run(
            interface_script(login.address), check=False, max_output=4096
        ).stdout.strip()
        if not _INTERFACE_RE.fullmatch(interface):
            interface = ""
        prepared = Prepared(home, home_of_login, interface, runtime_path)
        if terms_for is not None:
            ending = ending_command(_cached_runtime(home_of_login), home, instance_id)
            _start_guard(connection, prepared, terms_for(home, ending))
        return prepared
    finally:
        connection.close()


_INTERFACE_RE = re.compile(r"[A-Za-z0-9_.@-]{1,15}")


def _cached_runtime(home_of_login: str) -> str:
    return f"{home_of_login}/{CACHE_DIR}/{Path(runtime.node_path()).name}"


def _place_runtime(connection: NodeConnection, home_of_login: str, home: str) -> str:
    """The node runtime at its usual path under the allocation's home, copied from the host's
    cache (`_ensure_cached`)."""
    cached = _ensure_cached(connection, home_of_login)
    target = f"{home}/{runtime.node_path()}"
    connection.run(
        f"mkdir -p {shlex.quote(str(Path(target).parent))} && "
        f"cp {shlex.quote(cached)} {shlex.quote(target)}"
    )
    return target


def _ensure_cached(connection: NodeConnection, home_of_login: str) -> str:
    """The host's cached copy of this node runtime, sent whole when the host lacks it (checked
    by its digest there, then renamed into place)."""
    data = runtime.build()
    digest = hashlib.sha256(data).hexdigest()
    cached = _cached_runtime(home_of_login)
    q_cached, q_part = shlex.quote(cached), shlex.quote(f"{cached}.part")
    check = f"test -f {q_cached} && sha256sum {q_cached} | cut -d' ' -f1"
    if connection.run(check, check=False, max_output=4096).stdout.strip() != digest:
        connection.run(
            f"mkdir -p {shlex.quote(str(Path(cached).parent))} && base64 -d > {q_part} && "
            f"test \"$(sha256sum {q_part} | cut -d' ' -f1)\" = {digest} && "
            f"mv -f {q_part} {q_cached}",
            stdin=base64.b64encode(data).decode(),
        )
    return cached


def _start_guard(connection: NodeConnection, prepared: Prepared, terms: str) -> None:
    layout = GuardLayout(_job_of(terms))
    home = prepared.home
    terms_path = f"{home}/{layout.terms}"
    connection.run(
        f"mkdir -p {shlex.quote(str(Path(terms_path).parent))} && cat > {shlex.quote(terms_path)}",
        stdin=terms,
    )
    connection.run(detached(guard_boot(home, prepared.runtime_path, terms_path)))


def _job_of(terms: str) -> str:
    return str(json.loads(terms)["job_id"])


def end(login: FleetLogin, instance_id: str) -> str:
    """End the allocation `instance_id` on the host (see the module); returns what the node
    program said. Raises `NodeUnreachable` when the host does not answer."""
    connection = _connection(login, timeout=END_TIMEOUT_S)
    try:
        home_of_login = login_home(
            connection.run('echo "login-home=$HOME"', max_output=8192).stdout
        )
        home = allocation_home(home_of_login, instance_id)
        command = ending_command(_ensure_cached(connection, home_of_login), home, instance_id)
        return connection.run(command, check=False, max_output=64 * 1024).stdout[-4000:]
    finally:
        connection.close()


SWEEP_LIMIT = 1000  # allocation folders a host may list; more is not believed


def sweep(login: FleetLogin, keep: set[str]) -> list[str]:
    """End every allocation on the host but those of `keep` (held claims): what a host that
    stopped answering left behind. Returns the ids ended. The host's listing is checked: only
    names of the allocation id's shape are taken, at most `SWEEP_LIMIT`."""
    connection = _connection(login, timeout=END_TIMEOUT_S)
    try:
        listed = connection.run(
            f'ls -1 "$HOME/{FLEET_DIR}" 2>/dev/null | head -n {SWEEP_LIMIT}',
            check=False,
            max_output=64 * 1024,
        ).stdout.split()
    finally:
        connection.close()
    leftovers = [name for name in listed if is_instance_id(name) and name not in keep]
    for instance_id in leftovers:
        end(login, instance_id)
    return leftovers
