"""What a node prints costs the controller a bounded amount of memory and never the job, on
real local nodes (sshd) read through the real read paths: the checkpoint agent's manifest, and
the run watch that mirrors a node's log and reads rank 0's progress from it.

Bounds are on the controller's Python heap (tracemalloc's peak, every thread counted).
"""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from pathlib import Path

from orchestrator.cluster.checkpoints.collector import MANIFEST_MAX_BYTES
from orchestrator.cluster.run_watch import RunWatch
from orchestrator.node import launch
from orchestrator.node.checkpoint_protocol import AgentLayout
from orchestrator.node.progress import Metrics
from orchestrator.remote.lines import CUT_MARK, DEFAULT_MAX_LINE
from tests.support.checkpoint_nodes import end_run, keeper_nodes
from tests.support.helpers import loopback_cluster


def test_a_manifest_without_end_is_not_read_a_warning_and_no_failure(tmp_path: Path) -> None:
    """The agent's manifest a symlink to /dev/zero: a collection reads at most
    `MANIFEST_MAX_BYTES` (32 MiB) of it, within seconds (not the read's 30 s timeout), takes it
    as no manifest this time, records one warning, and collects again once the manifest is
    sane. Bound: the heap peaks below 3 x that cap."""
    job = "endless-manifest-1"
    with keeper_nodes(tmp_path / "orch", job) as nodes:
        manifest = f"{launch.home_expr(AgentLayout(job).root)}/manifest.json"
        nodes.run(0, f"mv {manifest} {manifest}.good && ln -s /dev/zero {manifest}")
        tracemalloc.start()
        started = time.monotonic()
        try:
            collected = nodes.keeper.collect()  # raises nothing: the job goes on
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        elapsed = time.monotonic() - started
        assert collected.reports[0].agent == "alive" and collected.reports[0].manifest is None
        assert peak < 3 * MANIFEST_MAX_BYTES, f"peak {peak / 2**20:.0f} MiB"
        assert elapsed < 20, f"{elapsed:.0f} s"
        nodes.keeper.collect()  # the warning is not repeated
        (warning,) = [w for w in nodes.events("WARNING") if "manifest" in w]
        assert warning.startswith("node 0: checkpoint agent: its manifest is longer than 32 MiB")

        nodes.run(0, f"mv -f {manifest}.good {manifest} && printf weights > ckpt/model.pt")
        end_run(nodes.cluster, job)
        assert [u.name for u in nodes.keeper.finish(wait_s=30).installed] == ["model.pt"]


# Rank 0's log: a line with a character split across the first probe's 1 MiB, a line of
# 24 MiB that ends only then, a progress line, and bytes that are not text.
LOG_SCRIPT = r"""
import sys
limit = int(sys.argv[1])
out = sys.stdout.buffer
first = b"[default0]:start \xc3\xa9\n[default0]:"
out.write(first + b"z" * (limit - len(first) - 1) + "\u00e9".encode())
out.write(b"z" * (24 << 20) + b"\n")
out.write(b'[default0]:{"step": 7, "loss": 0.5}\n')
out.write(b"[default0]:bad \xff\xfe \x1b[2J\x00 end\n")
"""


def test_a_node_log_with_an_endless_line_is_mirrored_exactly_and_still_watched(
    tmp_path: Path,
) -> None:
    """The run watch mirrors the node's log byte for byte (offsets count the node's bytes,
    whatever it prints), shows rank 0's 24 MiB line cut, reads the progress line after it,
    and shows undecodable and control bytes as U+FFFD. Bound: the heap peaks below 16 MiB,
    less than the line (the old reader kept the line whole and copied it at every tick)."""
    job = "endless-log-1"
    layout = launch.NodeLayout(job)
    metrics: list[Metrics] = []
    shown: list[str] = []
    with loopback_cluster(tmp_path / "orch", job, count=1) as cluster:
        node = cluster.head
        run_dir = launch.home_expr(layout.run_dir)
        node.run("cat > log.py", stdin=LOG_SCRIPT)
        node.run(f"mkdir -p {run_dir} && echo 0 > {run_dir}/exit_code && "
                 f"python3 log.py {launch.PROBE_LOG_LIMIT} > {run_dir}/node.log")  # fmt: skip
        size, digest = node.run(f"stat -c %s {run_dir}/node.log && "
                                f"sha256sum < {run_dir}/node.log").stdout.split()[:2]  # fmt: skip
        watch = RunWatch(
            cluster, layout, tmp_path / "logs",
            on_metrics=lambda m, _at: metrics.append(m), on_line=shown.append,
        )  # fmt: skip
        tracemalloc.start()
        try:
            for _ in range(40):
                assert watch.tick().done
                if watch.offsets[0] >= int(size):
                    break
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    mirrored = (tmp_path / "logs" / "node-0.log").read_bytes()
    assert (len(mirrored), hashlib.sha256(mirrored).hexdigest()) == (int(size), digest)
    assert [m.step for m in metrics] == [7]
    cut = "z" * (200 - len("[default0]:")) + CUT_MARK.format(max_line=DEFAULT_MAX_LINE)
    assert shown == ["start \u00e9", cut, "bad \ufffd\ufffd \ufffd[2J\ufffd end"]
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
