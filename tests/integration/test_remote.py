"""The SSH layer against real sshd nodes: pinning, reuse, stdin, timeouts, rsync filters."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster import Cluster
from orchestrator.errors import HostKeyMismatch, NodeUnreachable, RemoteError
from orchestrator.remote.keys import ensure_identity
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import Transfer, push_argv, run_parallel
from tests.helpers import loopback_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path_factory.mktemp("orch"), "t", count=2, gpus_per_node=1) as built:
        yield built


def test_keys_are_private(cluster: Cluster) -> None:
    key = cluster.identity.private_key
    assert key.stat().st_mode & 0o777 == 0o600
    assert key.parent.stat().st_mode & 0o777 == 0o700


def test_one_connection_serves_many_commands(cluster: Cluster) -> None:
    head = cluster.head
    first = head.run("echo $PPID").stdout
    transport = head.transport
    for _ in range(5):
        head.run("true")
    assert head.transport is transport and head.is_alive()
    # Each command is a new session of the same connection: one sshd process serves them all.
    assert head.run("echo $PPID").stdout == first


def test_stdin_reaches_the_command_and_failures_carry_the_result(cluster: Cluster) -> None:
    payload = "line 1\n'quoted' $HOME `x`\n" * 1000
    assert cluster.head.run("cat > f && cat f", stdin=payload).stdout == payload
    with pytest.raises(RemoteError) as info:
        cluster.head.run("echo boom >&2; exit 7")
    assert info.value.result.exited == 7  # type: ignore[attr-defined]
    assert "boom" in str(info.value)
    assert cluster.head.run(["printf", "%s", "a b; $c"]).stdout == "a b; $c"


def test_a_command_past_its_timeout_is_reported(cluster: Cluster) -> None:
    with pytest.raises(NodeUnreachable, match="did not finish"):
        cluster.head.run("sleep 5", timeout=0.5)


def test_a_changed_host_key_is_refused(cluster: Cluster) -> None:
    other = cluster.addresses[1].host_key
    forged = dataclasses.replace(cluster.addresses[0], host_key=other)
    with pytest.raises(HostKeyMismatch, match="different host key"):
        NodeConnection(forged, cluster.identity, connect_timeout=5).run("true")


def test_a_closed_port_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from orchestrator.remote.keys import HostAddress

    identity = ensure_identity(tmp_path / "keys", "x")
    key = " ".join(identity.public_key.split()[:2])
    address = HostAddress("ghost", "127.0.0.1", port, "root", key)
    with pytest.raises(NodeUnreachable, match="cannot reach ghost"):
        NodeConnection(address, identity, connect_timeout=2).run("true")


def test_workdir_sync_honours_ignore_files_on_every_node(cluster: Cluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "code.py").write_text("x = 1\n")
    (work / ".gitignore").write_text("*.log\nbuild/\n")
    (work / ".orchignore").write_text("secret.txt\n")
    (work / "pkg" / ".gitignore").write_text("local.cfg\n")
    for name in ("run.log", "secret.txt", "pkg/local.cfg", "build/out.bin", ".git/HEAD"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("ignored")
    transfers = [
        Transfer(a.name, push_argv(work, a, cluster.identity, "synced", workdir=True))
        for a in cluster.addresses
    ]
    run_parallel(transfers)
    (work / "pkg" / "code.py").unlink()  # removed locally: removed on the nodes on the next sync
    (work / "pkg" / "new.py").write_text("y = 2\n")
    run_parallel(transfers)
    for connection in cluster.connections:
        files = connection.run("cd synced && find . -type f | sort").stdout.split()
        assert files == ["./.gitignore", "./.orchignore", "./pkg/.gitignore", "./pkg/new.py"]
    # Transfers to a node share one multiplexed ssh connection (a socket per node).
    sockets = list(cluster.identity.control_dir.iterdir())
    assert len(sockets) == len(cluster.addresses)
    assert cluster.identity.control_dir.stat().st_mode & 0o777 == 0o700
