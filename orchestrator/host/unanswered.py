"""Why a controller host did not answer over SSH, and what to do about it: a pure reading of the
error the SSH layer raised, so that `orch controller up` can say it instead of ending a host
that may well be alive.

Kinds, from the error and the errors that caused it:

- `host key`: the host presented another key than the one pinned at `up`;
- `auth`: it refused this ORCH_HOME's login key;
- `refused`: nothing listens on its SSH port (its sshd stopped, the machine restarts);
- `unreachable`: no route to it (the network, a firewall that rejects);
- `timeout`: no answer in time: a firewall that drops (on AWS, a security group whose SSH rule
  no longer admits this machine's address, e.g. after the laptop's public IP changed), a
  network glitch, or a machine too busy to answer;
- `other`: anything else, its message said as it is.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.errors import HostKeyMismatch

CIDR_FIX = (
    "if this machine's public address changed (another network, a VPN), the security group's "
    "SSH rule no longer admits it: set aws.ssh_cidr (ORCH_AWS_SSH_CIDR) to your new address "
    "with /32 and admit it in the group (infra/'s ssh_cidr_blocks, or the EC2 console's "
    "security group editor), then run `orch controller up` again; after a short network "
    "glitch, just run it again"
)
FIXES = {
    "host key": "the machine at that address is not the one `up` set up, or the connection is "
    "intercepted: find out which before anything else",
    "auth": "the host no longer accepts this ORCH_HOME's login key (the record's `identity`): "
    "authorize its public key there again",
    "refused": "its sshd does not listen: wait for the machine to finish restarting, or start "
    "sshd there, then run `orch controller up` again",
    "unreachable": "check this machine's network and any firewall between it and the host, "
    "then run `orch controller up` again",
    "timeout": "check this machine's network and any firewall between it and the host (a "
    "busy host answers late: run `orch controller up` again)",
    "other": "run `orch controller up` again once it answers",
}


@dataclass(frozen=True)
class Unanswered:
    """Why the host did not answer over SSH (`kind`, see the module docstring), the error's
    own words (`detail`) and what to do (`fix`)."""

    kind: str
    detail: str
    fix: str


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every error behind it: causes, contexts, and the per-address errors of a
    connection that failed on each address (paramiko's `NoValidConnectionsError.errors`)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        errors = getattr(current, "errors", None)
        if isinstance(errors, dict):
            stack += [e for e in errors.values() if isinstance(e, BaseException)]


def _kind(error: BaseException) -> str | None:
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error).lower()
    if isinstance(error, HostKeyMismatch) or "BadHostKeyException" in names:
        return "host key"
    if "AuthenticationException" in names or "authentication failed" in text:
        return "auth"
    code = getattr(error, "errno", None)
    if isinstance(error, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable"
    if isinstance(error, TimeoutError) or "timed out" in text or "did not finish within" in text:
        return "timeout"
    if "error reading ssh protocol banner" in text or "no existing session" in text:
        return "timeout"  # connected, and no SSH handshake in time (paramiko's words)
    return None


def explain(exc: BaseException, *, on_aws: bool) -> Unanswered:
    """Why the host did not answer (`exc`: what the SSH layer raised) and what to do; on AWS
    (`on_aws`) a timeout or no route also names the security group's SSH rule. Pure."""
    order = ("host key", "auth", "refused", "unreachable", "timeout")
    found = {kind for error in _chain(exc) if (kind := _kind(error)) is not None}
    kind = next((k for k in order if k in found), "other")
    fix = FIXES[kind]
    if on_aws and kind in ("timeout", "unreachable"):
        fix = CIDR_FIX
    return Unanswered(kind, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__,
                      fix)  # fmt: skip
