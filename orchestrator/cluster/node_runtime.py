"""Put the node runtime (`orchestrator.node.runtime`) on a node, once per version.

A node that holds this version already is not sent it again: the check costs one short
command, the install the zipapp's bytes (in base64), checked on the node before use.
"""

from __future__ import annotations

from orchestrator.node import runtime
from orchestrator.remote.ssh import NodeConnection


def ensure_runtime(connection: NodeConnection, timeout: float = 60.0, before: str = "") -> bool:
    """Make sure the node of `connection` holds this version of the runtime; True when it
    had to be sent. `before`: shell text run first, in the same command (a program's folder
    made); its failure fails the call. Raises what `NodeConnection.run` raises."""
    check = f"{before} && {runtime.check_command()}" if before else runtime.check_command()
    if runtime.has_runtime(connection.run(check, timeout=timeout).stdout):
        return False
    connection.run(runtime.install_command(), stdin=runtime.install_input(), timeout=timeout)
    return True
