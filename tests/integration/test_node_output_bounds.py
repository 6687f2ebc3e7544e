"""What a node prints costs the controller a bounded amount of memory and never the job, on
real local nodes (sshd) read through the real read paths: the checkpoint agent's manifest.

Bounds are on the controller's Python heap (tracemalloc's peak, every thread counted).
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

from orchestrator.cluster.checkpoints.collector import MANIFEST_MAX_BYTES
from orchestrator.node import launch
from orchestrator.node.checkpoint_protocol import AgentLayout
from tests.support.checkpoint_nodes import end_run, keeper_nodes


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
