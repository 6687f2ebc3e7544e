"""A node whose sshd starts presenting another host key is refused, with a clear message.

The node's real sshd gets a new host key on disk and a SIGHUP (it re-executes itself and
reads the key again), as a replaced or intercepted machine would look. Both ways orch talks
to nodes, the persistent SSH connection and rsync over ssh, must then refuse it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.errors import HostKeyMismatch, NodeUnreachable
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import push_argv, run_rsync
from tests.support.helpers import loopback_cluster
from tests.support.waiting import wait_until


def _swap_host_key(node_dir: Path) -> None:
    key = Ed25519PrivateKey.generate()
    private = node_dir / "ssh_host_ed25519_key"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    private.chmod(0o600)
    os.kill(int((node_dir / "sshd.pid").read_text()), signal.SIGHUP)


def test_a_swapped_host_key_refuses_ssh_and_rsync(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    with loopback_cluster(home, "hostkey", count=1) as cluster:
        assert cluster.head.run("echo before").stdout == "before\n"
        cluster.head.close()
        (node_dir,) = [p for p in home.glob("local/nodes/*") if (p / "sshd.pid").exists()]
        _swap_host_key(node_dir)

        address, identity = cluster.addresses[0], cluster.identity

        def refusal() -> HostKeyMismatch | None:
            connection = NodeConnection(address, identity, connect_timeout=5)
            try:
                connection.run("echo after")
            except HostKeyMismatch as exc:
                return exc
            except NodeUnreachable:
                return None  # sshd re-executes itself: a moment without a listener is expected
            finally:
                connection.close()
            pytest.fail("the connection was accepted with a changed host key")

        refused = wait_until(refusal, "sshd back with its new key", 20)
        assert "presented a different host key than its provider reported" in str(refused)
        assert "orch down" in str(refused)

        source = tmp_path / "payload"
        source.write_text("must not arrive")
        with pytest.raises(HostKeyMismatch) as info:
            run_rsync(push_argv(source, address, identity, "~/payload"), what="sync")
        message = str(info.value)
        assert message.startswith("sync: the node presented a different host key")
        assert "orch down" in message
        assert not (node_dir / "disk" / "payload").exists()

        identity.known_hosts.write_text("")  # nothing pinned at all
        with pytest.raises(HostKeyMismatch, match="sync: no host key is pinned for the node"):
            run_rsync(push_argv(source, address, identity, "~/payload"), what="sync")
