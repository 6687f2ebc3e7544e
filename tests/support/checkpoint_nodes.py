"""Real local nodes with checkpoint agents on them, for the integration tests and benchmarks.

`keeper_nodes` launches loopback nodes, starts a stand-in for the run on each (a process whose
pid is the run's pid, as `launch.start_command` records it), and prepares a `CheckpointKeeper`
against them: the agents are installed and armed exactly as for a real job. `end_run` records
the run's exit, after which the agents stage what is left and finish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, KeeperOptions, Resume
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.connections import Cluster
from orchestrator.config import LocalSettings, Settings
from orchestrator.errors import UnknownJob
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.node import launch
from orchestrator.node.checkpoint_protocol import NodeManifest
from orchestrator.spec.model import CheckpointSpec
from tests.support.helpers import loopback_cluster
from tests.support.waiting import wait_until

CHECKPOINT_DIR = "ckpt"  # home-relative on every node


@dataclass
class KeeperNodes:
    cluster: Cluster
    keeper: CheckpointKeeper
    ledger: Ledger
    mirror: CheckpointMirror
    job_id: str
    settings: Settings
    resume: Resume | None = None

    def run(self, rank: int, script: str) -> str:
        return self.cluster.connections[rank].run(["bash", "-c", script]).stdout

    def events(self, kind: str) -> list[str]:
        return [e.message for e in self.ledger.events(self.job_id) if e.kind == kind]


def start_run(cluster: Cluster, job_id: str) -> None:
    """A stand-in for the detached run on every node: its pid where the agents look."""
    run_dir = launch.home_expr(launch.NodeLayout(job_id).run_dir)
    script = (
        f"mkdir -p {run_dir} && cd {run_dir} && "
        "(setsid nohup sleep 3600 > /dev/null 2>&1 < /dev/null & echo $! > pid)"
    )
    cluster.map(lambda rank, c: c.run(script))


def end_run(cluster: Cluster, job_id: str) -> None:
    run_dir = launch.home_expr(launch.NodeLayout(job_id).run_dir)
    cluster.map(lambda rank, c: c.run(f'cd {run_dir} && kill "$(cat pid)"; echo 0 > exit_code'))


@contextmanager
def keeper_nodes(
    home: Path,
    job_id: str,
    *,
    count: int = 1,
    checkpoint: CheckpointSpec | None = None,
    options: KeeperOptions | None = None,
    settings: Settings | None = None,
    before_arm: str | None = None,
    node_dir: str = CHECKPOINT_DIR,
) -> Iterator[KeeperNodes]:
    """Nodes with armed agents; `before_arm` runs on every node first, as a workdir sync or a
    checkpoint push would (what it leaves is the agents' baseline). The job's ledger row and
    mirror are kept between uses of the same `home`, as across a job's restarts. `node_dir`:
    the checkpoint directory on the nodes (`NodeLayout.node_path` of the spec's)."""
    settings = settings or Settings(home=home, local=LocalSettings(network="loopback"))
    ledger = Ledger(make_engine(home / "orch.db"))
    try:
        ledger.get_job(job_id)
    except UnknownJob:
        ledger.add_job(
            Job(
                id=job_id, name="j", provider="local", nodes=count, gpus_per_node=1,
                spec_json="{}", spec_path="job.yaml", created_at=datetime.now(UTC),
            )
        )  # fmt: skip
    spec = checkpoint or CheckpointSpec(dir=f"~/{CHECKPOINT_DIR}")
    mirror = CheckpointMirror(settings.job_dir(job_id) / "checkpoints")
    mirror.root.parent.mkdir(parents=True, exist_ok=True)
    keeper = CheckpointKeeper(
        job_id=job_id, checkpoint=spec, node_dir=node_dir, mirror=mirror, ledger=ledger,
        settings=settings, line=lambda _text: None,
        options=options or KeeperOptions(pull_every=3600),
    )  # fmt: skip
    with loopback_cluster(home, job_id, count=count) as cluster:
        cluster.map(lambda rank, c: c.run(f"mkdir -p {launch.home_expr(node_dir)}"))
        if before_arm:
            cluster.map(lambda rank, c: c.run(["bash", "-c", before_arm]))
        start_run(cluster, job_id)
        nodes = KeeperNodes(cluster, keeper, ledger, mirror, job_id, settings)
        nodes.resume = keeper.prepare(cluster)
        wait_for_agents(nodes)
        try:
            yield nodes
        finally:
            keeper.stop_watching()


def wait_for_agents(nodes: KeeperNodes, timeout: float = 20.0) -> None:
    """Until every agent has written its first manifest (its baseline is taken)."""
    wait_for_manifests(nodes, lambda manifest: True, "every agent's first manifest", timeout)


def wait_for_manifests(
    nodes: KeeperNodes, holds: Callable[[NodeManifest], bool], what: str, timeout: float = 20.0
) -> None:
    """Until every node's agent has a manifest and `holds` it (`manifest.done`: the run ended
    and the agent staged what it left)."""

    def every_node() -> bool:
        reports = nodes.keeper.collector.read()
        return len(reports) == len(nodes.cluster.instances) and all(
            r.manifest is not None and holds(r.manifest) for r in reports.values()
        )

    wait_until(every_node, what, timeout, interval=0.1)


def collect_until(nodes: KeeperNodes, done, timeout: float = 30.0):  # noqa: ANN001, ANN201
    """Collect again and again until `done(collected)` holds; returns that collection."""

    complete: list[str] = []  # what the last collection had complete

    def collected():  # noqa: ANN202
        collection = nodes.keeper.collect()
        complete[:] = [u.name for u in collection.complete]
        return collection if done(collection) else None

    return wait_until(
        collected, "a collection that holds", timeout,
        fail=lambda said: AssertionError(f"{said}; complete: {complete}"),
    )  # fmt: skip
