"""The node runtime on real local nodes: sent once per node and version, run from there.

A kept cluster serves one job after another: the second job's checkpoint agents find the
runtime the first job sent and are not sent it again. A node launched with a guard holds the
runtime from its boot (the provider writes it to the node's disk), and its guard runs from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, KeeperOptions
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.node_runtime import ensure_runtime
from orchestrator.config import LocalSettings, Settings
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.node import runtime
from orchestrator.node.checkpoint_protocol import AgentLayout
from orchestrator.node.clear_protocol import reset_command
from orchestrator.node.guard_protocol import GuardLayout, GuardTerms, parse_status, status_command
from orchestrator.node.launch import NodeLayout
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity
from orchestrator.spec.model import CheckpointSpec
from tests.support.checkpoint_nodes import end_run, start_run
from tests.support.helpers import loopback_cluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

CLUSTER = "dev-7c1e"


def count_installs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Ranks the runtime was sent to, one entry per transfer: every command of the cluster's
    real connections still runs, and one that carries the runtime's bytes is counted."""
    sent: list[int] = []
    for rank, connection in enumerate(cluster.connections):

        def run(*args, _run=connection.run, _rank=rank, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if kwargs.get("stdin") == runtime.install_input():
                sent.append(_rank)
            return _run(*args, **kwargs)

        monkeypatch.setattr(connection, "run", run)
    return sent


@contextmanager
def one_job(home: Path, cluster: Cluster, job_id: str) -> Iterator[None]:
    """A job on the kept cluster as far as its checkpoint agents go: the node reset of its
    last job, the agents sent and armed (while inside), then the run's end and theirs."""
    settings = Settings(home=home, local=LocalSettings(network="loopback"))
    ledger = Ledger(make_engine(home / "orch.db"))
    ledger.add_job(
        Job(
            id=job_id, name="j", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=datetime.now(UTC), cluster_id=CLUSTER,
        )
    )  # fmt: skip
    mirror = CheckpointMirror(settings.job_dir(job_id) / "checkpoints")
    mirror.root.parent.mkdir(parents=True, exist_ok=True)
    keeper = CheckpointKeeper(
        job_id=job_id, checkpoint=CheckpointSpec(dir="~/ckpt"), node_dir="ckpt", mirror=mirror,
        ledger=ledger, settings=settings, line=lambda _text: None,
        options=KeeperOptions(pull_every=3600), node_owner=CLUSTER,
    )  # fmt: skip
    cluster.map(lambda rank, c: c.run(reset_command(NodeLayout(CLUSTER), "ckpt")))
    start_run(cluster, CLUSTER)
    keeper.prepare(cluster)
    try:
        wait_until(
            lambda: all(r.manifest is not None for r in keeper.collector.read().values()),
            "the checkpoint agents' first manifests", timeout=30,
        )  # fmt: skip
        yield
    finally:
        end_run(cluster, CLUSTER)
        keeper.stop_watching()
    alive = f'kill -0 "$(cat "$HOME"/{AgentLayout(CLUSTER).root}/pid)"'
    wait_until(
        lambda: all(c.run(alive, check=False).exited for c in cluster.connections),
        "the checkpoint agents to finish", timeout=30,
    )  # fmt: skip


def agent_command_lines(cluster: Cluster) -> list[str]:
    pids = f'"$HOME"/{AgentLayout(CLUSTER).root}/pid'
    return [
        c.run(f"tr '\\0' ' ' < /proc/$(cat {pids})/cmdline").stdout for c in cluster.connections
    ]


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path / "orch", CLUSTER, count=2) as cluster:
        yield cluster


def test_a_second_job_on_a_kept_cluster_is_not_sent_the_runtime_again(
    tmp_path: Path, kept: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = count_installs(kept, monkeypatch)
    stat = f'stat -c %i:%y "$HOME"/{runtime.node_path()}'
    with one_job(tmp_path / "orch", kept, "first-1"):
        assert sorted(sent) == [0, 1]  # once to each node
        first = [c.run(stat).stdout for c in kept.connections]
    with one_job(tmp_path / "orch", kept, "second-2"):
        assert sorted(sent) == [0, 1], "the second job sent the runtime again"
        assert [c.run(stat).stdout for c in kept.connections] == first
        for line in agent_command_lines(kept):  # its agents run from the runtime
            assert f"{runtime.file_name()} checkpoint-agent watch" in line


def test_a_node_holds_the_runtime_from_its_boot_and_its_guard_runs_from_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    settings = Settings(home=home, local=LocalSettings(network="loopback"))
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(CLUSTER), "test")
    terms = GuardTerms(
        job_id=CLUSTER, interval_s=0.5, silence_s=60.0, allowance_s=600.0, deadman_s=None,
        stop_grace_s=1.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
    )  # fmt: skip
    [node] = provider.launch(
        LaunchRequest(
            job_id=CLUSTER, cluster=CLUSTER, count=1, gpus_per_node=1,
            public_key=identity.public_key, guard=terms,
        )
    )  # fmt: skip
    cluster = Cluster([node], identity, connect_timeout=5)
    connection = cluster.head
    try:
        layout = GuardLayout(CLUSTER)
        wait_until(
            lambda: parse_status(connection.run(status_command(layout)).stdout).armed,
            "the guard to arm", timeout=30,
        )  # fmt: skip
        assert not ensure_runtime(connection), "the runtime was sent to a node that held it"
        status = json.loads(connection.run(f"cat {layout.status}").stdout)
        cmdline = connection.run(f"tr '\\0' ' ' < /proc/{status['pid']}/cmdline").stdout
        assert f"{runtime.file_name()} guard" in cmdline
    finally:
        cluster.close()
        provider.terminate([node.instance_id])
