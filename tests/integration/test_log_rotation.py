"""Node logs mirrored through the real watch are capped and rotated, and `orch logs` reads
them whole, in order, also after a new controller (a new watch) took over.

The node is a real local sshd; its log is written in parts, each followed by a watch tick,
as a trainer would print between two ticks.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.run_watch import RunWatch
from orchestrator.config import LocalSettings, LogSettings, Settings
from orchestrator.control.process.controllers import register_job
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.node import launch
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity
from orchestrator.spec.loading import load_job
from tests.support.helpers import orch_env, run_orch

PART = 6000  # bytes of node log printed between two ticks


def part(n: int) -> str:
    line = f"part {n} " + "x" * 90 + "\n"
    return line * (PART // len(line))


def test_a_capped_log_rotates_and_orch_logs_reads_every_kept_part(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path / "orch",
        local=LocalSettings(network="loopback"),
        logs=LogSettings(max_bytes=10_000, keep=2),
    )
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: logs\nworkdir: work\nrun: 'true'\n")
    ledger = Ledger(make_engine(settings.db_path))
    job = register_job(settings, ledger, load_job(spec, {}), "local", "logs-000001")
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(job.id), "test")
    nodes = provider.launch(
        LaunchRequest(
            job_id=job.id, cluster=job.id, count=1, gpus_per_node=1,
            public_key=identity.public_key,
        )
    )  # fmt: skip
    layout = launch.NodeLayout(job.id)
    cluster = Cluster(nodes, identity, connect_timeout=10)
    node = cluster.connections[0]

    def watch() -> RunWatch:
        return RunWatch(
            cluster, layout, settings.job_dir(job.id) / "logs",
            on_metrics=lambda *_: None, on_line=lambda _: None,
            max_log_bytes=settings.logs.max_bytes, log_keep=settings.logs.keep,
        )  # fmt: skip

    def node_prints(text: str) -> None:
        run_dir = launch.home_expr(layout.run_dir)
        node.run(f"mkdir -p {run_dir} && echo 0 > {run_dir}/exit_code", timeout=30)
        node.run(f"cat >> {launch.home_expr(layout.log)}", stdin=text, timeout=30)

    try:
        first = watch()
        for n in range(5):
            node_prints(part(n))
            first.tick()
        logs = settings.job_dir(job.id) / "logs"
        names = sorted(p.name for p in logs.glob("node-0.log*"))
        assert names == ["node-0.log", "node-0.log.1", "node-0.log.2"]
        assert all(p.stat().st_size <= settings.logs.max_bytes for p in logs.glob("node-0.log*"))

        # An adopting controller's watch resumes where the mirror ends, rotated parts included.
        node_prints(part(5))
        watch().catch_up()
        ledger.update_job(job.id, state=JobState.SUCCEEDED)  # no controller to revive
        shown = run_orch(["logs", job.id, "--node", "0"], orch_env(settings.home))
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == "".join(part(n) for n in (3, 4, 5))
        # Each tick recorded when it pulled its lines: --since and --json read those times.
        since = ["logs", job.id, "--node", "0", "--json", "--since", "10m"]
        pulled = [
            json.loads(line)
            for line in run_orch(since, orch_env(settings.home)).stdout.splitlines()
        ]
        assert [o["line"] for o in pulled] == "".join(part(n) for n in (3, 4, 5)).splitlines()
        assert all(o["node"] == 0 and o["rank"] is None and o["time"] for o in pulled)
    finally:
        cluster.close()
        provider.terminate([n.instance_id for n in nodes])
