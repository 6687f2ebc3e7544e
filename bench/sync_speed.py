"""Sync of a 2,000-file tree to 2 nodes with orch, against one raw rsync to one node.

Both go over ssh to the same local nodes. "first" is a sync into an empty directory,
"incremental" a sync after one file changed. Prints medians and orch/baseline ratios.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import local_nodes, median, report, timed  # noqa: E402
from orchestrator.remote.sync import (  # noqa: E402
    Transfer,
    push_argv,
    run_parallel,
    ssh_transport_argv,
)


def make_tree(root: Path, files: int) -> None:
    for i in range(files):
        path = root / f"pkg{i % 40:02d}" / f"sub{i % 7}" / f"module_{i:04d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# file {i}\nVALUE = {i}\n" + "x = 1\n" * (i % 50))
    (root / ".gitignore").write_text("*.tmp\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, local_nodes(2) as nodes:
        tree = Path(tmp) / "tree"
        make_tree(tree, args.files)
        cluster = nodes.cluster
        head = cluster.addresses[0]
        raw_transport = shlex.join(ssh_transport_argv(head, cluster.identity, 10, multiplex=False))

        def raw_rsync() -> None:
            subprocess.run(
                ["rsync", "-a", "-e", raw_transport, f"{tree}/", f"{head.user}@{head.host}:raw/"],
                check=True,
            )

        def orch_sync() -> None:
            run_parallel(
                [
                    Transfer(a.name, push_argv(tree, a, cluster.identity, "orch", workdir=True))
                    for a in cluster.addresses
                ]
            )

        def orch_one_node() -> None:
            # orch's own overhead, without the fan-out: both local "nodes" share this
            # machine's 2 cores and disk, so a second node doubles the receiving work here.
            argv = push_argv(tree, head, cluster.identity, "orch1", workdir=True)
            run_parallel([Transfer("node 0", argv)])

        # Each contender syncs into its own directory; before a first sync only that directory
        # is emptied and the disk flushed, so no run pays for another's deletes or writeback.
        contenders = {"raw": raw_rsync, "orch": orch_sync, "orch1": orch_one_node}
        first: dict[str, list[float]] = {name: [] for name in contenders}
        incremental: dict[str, list[float]] = {name: [] for name in contenders}
        for i in range(args.repeats):
            # Alternate which goes first, so neither always meets a cold page cache.
            order = list(contenders) if i % 2 == 0 else list(reversed(contenders))
            for name in order:
                for connection in cluster.connections:
                    connection.run(f"rm -rf {name}")
                os.sync()
                first[name].append(timed(contenders[name]))
            (tree / "pkg00" / "sub0" / "module_0000.py").write_text(f"# changed {i}\n")
            os.sync()
            for name in order:
                incremental[name].append(timed(contenders[name]))
        first_raw, first_orch = first["raw"], first["orch"]
        incr_raw, incr_orch = incremental["raw"], incremental["orch"]
        ok = report(
            f"sync of {args.files} files: orch to 2 nodes vs raw rsync to 1 node",
            [
                ("first sync", median(first_orch), median(first_raw)),
                ("first sync, orch to 1 node", median(first["orch1"]), median(first_raw)),
                ("after one changed file", median(incr_orch), median(incr_raw)),
            ],
            target=1.2,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
