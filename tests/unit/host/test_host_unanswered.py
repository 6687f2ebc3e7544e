"""Why a controller host did not answer over SSH (`orchestrator.host.unanswered`), read from the
errors the SSH layer raises, so that `orch controller up` says it (and what to do) instead of
taking a host that may be alive for dead."""

from __future__ import annotations

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from orchestrator.errors import HostKeyMismatch, NodeUnreachable
from orchestrator.host.unanswered import CIDR_FIX, explain


def unreachable(cause: BaseException) -> NodeUnreachable:
    """What the SSH layer raises for `cause` (as `NodeConnection` does: `raise ... from`)."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise NodeUnreachable(f"cannot reach controller host: {exc}") from exc
    except NodeUnreachable as error:
        return error


@pytest.mark.parametrize(
    ("cause", "kind"),
    [
        (NoValidConnectionsError({("127.0.0.1", 22): ConnectionRefusedError(111, "refused")}),
         "refused"),
        (ConnectionRefusedError(111, "Connection refused"), "refused"),
        (TimeoutError("timed out"), "timeout"),
        (paramiko.SSHException("No existing session"), "timeout"),  # connected, no handshake
        (paramiko.SSHException("Error reading SSH protocol banner"), "timeout"),
        (paramiko.AuthenticationException("Authentication failed."), "auth"),
        (OSError(113, "No route to host"), "unreachable"),
        (ValueError("something else"), "other"),
    ],
)  # fmt: skip
def test_why_ssh_failed_is_named(cause: BaseException, kind: str) -> None:
    said = explain(unreachable(cause), on_aws=False)
    assert said.kind == kind and said.fix and said.detail.startswith("cannot reach")


def test_a_host_key_mismatch_is_said_first() -> None:
    error = HostKeyMismatch("controller host presented a different host key")
    assert explain(error, on_aws=True).kind == "host key"
    assert "aws.ssh_cidr" not in explain(error, on_aws=True).fix


def test_on_aws_a_timeout_names_the_security_groups_ssh_rule() -> None:
    said = explain(unreachable(TimeoutError("timed out")), on_aws=True)
    assert said.fix == CIDR_FIX and "aws.ssh_cidr" in said.fix and "/32" in said.fix
    assert "aws.ssh_cidr" not in explain(unreachable(TimeoutError()), on_aws=False).fix
