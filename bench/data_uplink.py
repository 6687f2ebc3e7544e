"""Local data to 4 nodes over the uplink once, against one raw rsync of it to one node.

A dataset (1 GB by default: 16 files of 64 MB of random bytes) goes to 4 namespace nodes of
the local provider on a bridge of their own with `send_local_data`: to one node, then node to
node. The bytes this machine sends are read from the bridge's own counters (traffic between
two nodes never passes them); the baseline is one raw `rsync -a` over ssh of the same folder to
one node, alternating with it in the same run. Prints medians:

- uplink bytes / the dataset's size (target <= 1.1; a parallel push to every node sends 4x);
- time until all 4 nodes hold it / the raw rsync's time to one node (target <= 1.2);
- the uplink stage alone / the raw rsync (no target: orch's own overhead on that leg).

Every node here shares this machine's cores and disk, so each copy between nodes costs the
same CPU (ssh's cipher at both ends, rsync at both ends) as the uplink itself; on a cloud the
nodes' network is far faster than the uplink and the copies between them cost no uplink time.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
from ipaddress import IPv4Network
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import local_nodes, median, report_targets, timed  # noqa: E402
from orchestrator.cluster.data_fanout import send_local_data  # noqa: E402
from orchestrator.remote.sync import ssh_transport_argv  # noqa: E402

MB = 1_000_000
NODES = 4


def tx_bytes(bridge: str) -> int:
    return int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text())


def make_dataset(root: Path, megabytes: int, files: int) -> int:
    root.mkdir(parents=True)
    each = megabytes * MB // files
    for i in range(files):
        (root / f"shard_{i:03d}.bin").write_bytes(os.urandom(each))
    return each * files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1000, help="dataset size in MB")
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root: the nodes are network namespaces on a bridge of their own")
        return 2
    tag = secrets.token_hex(3)
    bridge = (f"orchb{tag}", IPv4Network(f"10.213.{100 + int(tag, 16) % 150}.0/24"))

    with (
        tempfile.TemporaryDirectory(prefix="orch-uplink-") as tmp,
        local_nodes(NODES, network="namespace", bridge=bridge) as nodes,
    ):
        data = Path(tmp) / "ds"
        size = make_dataset(data, args.mb, args.files)
        cluster = nodes.cluster
        head = cluster.addresses[0]
        transport = shlex.join(ssh_transport_argv(head, cluster.identity, 10, multiplex=False))

        def raw() -> None:
            subprocess.run(
                ["rsync", "-a", "-e", transport, f"{data}/", f"{head.user}@{head.host}:raw/"],
                check=True,
            )

        uplink_s: list[float] = []

        def orch() -> None:
            result = send_local_data(cluster, [(data, "~/orch")])
            uplink_s.append(result.uplink.seconds)

        times: dict[str, list[float]] = {"raw": [], "orch": []}
        sent: dict[str, list[int]] = {"raw": [], "orch": []}
        for i in range(args.repeats):
            order = ["raw", "orch"] if i % 2 == 0 else ["orch", "raw"]
            for name in order:
                for connection in cluster.connections:
                    connection.run("rm -rf raw orch", timeout=300)
                os.sync()
                before = tx_bytes(bridge[0])
                times[name].append(timed(raw if name == "raw" else orch))
                sent[name].append(tx_bytes(bridge[0]) - before)
        for connection in cluster.connections:  # the copies are the same on every node
            said = connection.run("cd orch && sha256sum shard_* | sha256sum", timeout=300)
            assert (
                said.stdout
                == cluster.head.run("cd orch && sha256sum shard_* | sha256sum", timeout=300).stdout
            )
        data_mb = size / MB
        ok = report_targets(
            f"{data_mb:.0f} MB local dataset ({args.files} files) to {NODES} nodes: the uplink "
            "once, then node to node",
            [
                ("uplink bytes to 4 nodes", median(sent["orch"]) / MB, "MB", data_mb,
                 "the dataset's size", "ratio <= 1.1"),
                ("raw rsync's uplink bytes to 1 node", median(sent["raw"]) / MB, "MB", data_mb,
                 "the dataset's size", "-"),
                ("time until all 4 nodes hold it", median(times["orch"]), "s",
                 median(times["raw"]), "raw rsync to 1 node", "ratio <= 1.2"),
                ("the uplink stage alone", median(uplink_s), "s", median(times["raw"]),
                 "raw rsync to 1 node", "-"),
            ],
        )  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
