"""Local data over the uplink once, on 3 real namespace nodes of the local provider: the bytes
this machine sends on the nodes' bridge (its counters) stay near the data's size whatever the
node count, every node ends with the same files, the one-time key is gone from every node
afterwards, and a transfer cut short resumes instead of starting again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster import data_fanout
from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.data_fanout import (
    TransferProgress,
    copy_between_nodes,
    send_local_data,
)
from orchestrator.errors import ConfigError, RemoteError
from orchestrator.remote.node_copy import PARTIAL_DIR
from tests.support.bridge_nodes import bridge_cluster, tx_bytes

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="namespace nodes need root"),
]

MIB = 1 << 20
LISTING = (
    "cd {path} && find . -type f ! -path './{partial}/*' -print0 | sort -z | xargs -0r sha256sum"
)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    with bridge_cluster(tmp_path_factory.mktemp("orch"), "fanout", count=3) as built:
        yield built


def dataset(root: Path, big_mib: int, small: int = 40) -> int:
    """A folder of one large random file and `small` small ones in subfolders; its bytes."""
    root.mkdir(parents=True)
    (root / "shard.bin").write_bytes(os.urandom(big_mib * MIB))
    for i in range(small):
        path = root / f"part{i % 4}" / f"sample_{i:03d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(os.urandom(1000 + i))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def local_listing(root: Path) -> list[str]:
    lines = []
    for path in sorted(root.rglob("*"), key=lambda p: str(p.relative_to(root)).encode()):
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{digest}  ./{path.relative_to(root)}")
    return sorted(lines, key=lambda line: line.split("  ", 1)[1].encode())


def node_listing(cluster: Cluster, rank: int, path: str) -> list[str]:
    said = cluster.connections[rank].run(LISTING.format(path=path, partial=PARTIAL_DIR))
    return said.stdout.splitlines()


def no_key_left(cluster: Cluster) -> None:
    for connection in cluster.connections:
        said = connection.run(
            "cat ~/.ssh/authorized_keys 2>/dev/null; ls -a ~ | grep -c '^.orch-fanout-' || true"
        )
        assert "orch-fanout" not in said.stdout, said.stdout
        assert said.stdout.strip().splitlines()[-1] == "0", said.stdout


def test_local_data_crosses_the_uplink_once(tmp_path: Path, nodes: tuple[Cluster, str]) -> None:
    cluster, bridge = nodes
    size = dataset(tmp_path / "ds", big_mib=24)
    seen: list[TransferProgress] = []
    before = tx_bytes(bridge)
    result = send_local_data(cluster, [(tmp_path / "ds", "~/data")], progress=seen.append)
    sent = tx_bytes(bridge) - before

    # 3 nodes: today's parallel push sends 3x; here the uplink carries the data once
    assert sent <= 1.1 * size, (sent, size)
    want = local_listing(tmp_path / "ds")
    assert len(want) == 41
    for rank in range(3):
        assert node_listing(cluster, rank, "data") == want, rank
    assert result.uplink_rank == 0
    assert result.uplink.bytes == size and result.fanout.bytes == 2 * size
    stages = [p.stage for p in seen]
    assert stages[0] == "uplink" and stages[-1] == "fan-out", stages
    last = seen[-1]
    assert last.bytes == last.total == 2 * size and last.seconds_left == 0
    no_key_left(cluster)


def slow_uplink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mb_per_s: int) -> None:
    """This machine's rsync capped at `mb_per_s` (a slow uplink), so a transfer can be cut
    short part way: rsync prints its count once a second."""
    wrapper = tmp_path / "slow-bin" / "rsync"
    wrapper.parent.mkdir()
    real = shutil.which("rsync")
    wrapper.write_text(f'#!/bin/sh\nexec {real} --bwlimit={mb_per_s}m "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")


def test_an_interrupted_transfer_resumes(
    tmp_path: Path, nodes: tuple[Cluster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, bridge = nodes
    size = dataset(tmp_path / "ds", big_mib=48, small=4)

    class Stop(Exception):
        pass

    def stop_part_way(progress: TransferProgress) -> None:
        if progress.stage == "uplink" and progress.bytes >= size // 4:
            raise Stop

    with monkeypatch.context() as slow:
        slow.setattr(data_fanout, "PROGRESS_EVERY_S", 0.0)
        slow_uplink(tmp_path, slow, mb_per_s=24)
        with pytest.raises(Stop):
            send_local_data(cluster, [(tmp_path / "ds", "~/resumed")], progress=stop_part_way)
    # what arrived is kept aside, never under the final name
    kept = cluster.connections[0].run(
        f"ls resumed/shard.bin 2>/dev/null; stat -c %s resumed/{PARTIAL_DIR}/shard.bin"
    )
    got = int(kept.stdout.split()[-1])
    assert size // 5 <= got < size and "resumed/shard.bin\n" not in kept.stdout, kept.stdout

    before = tx_bytes(bridge)
    result = send_local_data(cluster, [(tmp_path / "ds", "~/resumed")], holders=[0])
    sent = tx_bytes(bridge) - before
    assert sent <= size - 0.8 * got, (sent, size, got)  # took up where it stopped
    want = local_listing(tmp_path / "ds")
    for rank in range(3):
        assert node_listing(cluster, rank, "resumed") == want, rank
    assert result.uplink_rank == 0
    no_key_left(cluster)


def test_a_replacement_gets_a_survivor_s_copy_of_a_file_and_a_folder(
    nodes: tuple[Cluster, str],
) -> None:
    cluster, bridge = nodes
    head = cluster.connections[1]
    head.run("mkdir -p ds/a && head -c 3000000 /dev/urandom > ds/a/x && echo m > .ds.manifest")
    before = tx_bytes(bridge)
    copy_between_nodes(cluster, ["~/ds", ".ds.manifest"], 1, [0, 2])
    assert tx_bytes(bridge) - before < 200_000  # node to node, not through this machine
    want = head.run("sha256sum ds/a/x .ds.manifest").stdout
    for rank in (0, 2):
        assert cluster.connections[rank].run("sha256sum ds/a/x .ds.manifest").stdout == want
    no_key_left(cluster)


def test_a_vanished_local_source_is_named(tmp_path: Path, nodes: tuple[Cluster, str]) -> None:
    cluster, _ = nodes
    with pytest.raises(ConfigError, match="gone-data"):
        send_local_data(cluster, [(tmp_path / "gone-data", "~/gone")])


def test_a_failed_copy_between_nodes_leaves_no_key_behind(nodes: tuple[Cluster, str]) -> None:
    cluster, _ = nodes
    with pytest.raises(RemoteError, match=r"copying data from node 0 .* to node 1 .*no-such"):
        copy_between_nodes(cluster, ["~/no-such"], 0, [1, 2])
    no_key_left(cluster)
