"""The node-side steps of a job's start on real loopback nodes: the reset of a kept node after
a job with `checkpoint: {dir: .}` whose real checkpoint agent staged the run's `snapshot.pt`
(that file goes, the workdir stays), a reset and an agent install that fail and say which
step and what to do, and a `--fresh` sync that neither sends a stale snapshot nor leaves the
copy an earlier job's sync put on the node."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, KeeperOptions
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.config import Settings
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.kept_nodes import reset_nodes
from orchestrator.errors import RemoteError
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.node.clear_protocol import fresh_command
from orchestrator.node.launch import NodeLayout, home_expr
from orchestrator.spec.loading import load_job
from orchestrator.spec.model import CheckpointSpec
from tests.support.checkpoint_nodes import end_run, keeper_nodes
from tests.support.helpers import loopback_cluster
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120)]

WORKDIR_FILES = {"train.py": "print('train')\n", "conf/base.yaml": "lr: 1\n"}


def sync_line(layout: NodeLayout) -> str:
    """What a workdir sync leaves on a node, as one shell line."""
    workdir = home_expr(layout.workdir)
    return " && ".join(
        f"mkdir -p {workdir}/conf && printf %s {shlex.quote(text)} > {workdir}/{rel}"
        for rel, text in WORKDIR_FILES.items()
    )


def node_file(cluster, path: str) -> str:  # noqa: ANN001
    return cluster.connections[0].run(f"cat {home_expr(path)} 2>/dev/null", check=False).stdout


def test_a_kept_node_loses_the_last_jobs_snapshot_and_keeps_its_workdir(tmp_path: Path) -> None:
    owner = "dev-1"
    layout = NodeLayout(owner)
    node_dir = layout.node_path(".")
    spec = CheckpointSpec(dir=".")
    with keeper_nodes(
        tmp_path / "orch", owner, checkpoint=spec, node_dir=node_dir,
        before_arm=sync_line(layout), options=KeeperOptions(pull_every=3600),
    ) as nodes:  # fmt: skip
        # the tutorial's save: snapshot.pt in place, in the working directory
        nodes.run(0, f"cd {home_expr(layout.workdir)} && printf 'epoch 3' > snapshot.pt")
        end_run(nodes.cluster, owner)
        manifest = f"{layout.root}/checkpoint-agent/manifest.json"
        wait_until(
            lambda: json.loads(node_file(nodes.cluster, manifest) or "{}").get("done"),
            "the agent's last manifest", 30,
        )  # fmt: skip
        assert "snapshot.pt" in json.loads(node_file(nodes.cluster, manifest))["files"]
        nodes.keeper.stop_watching()

        (answer,) = reset_nodes(nodes.cluster, layout, node_dir, cluster_name="dev")
        assert (answer.removed, answer.dir) == (1, "files")
        for rel, text in WORKDIR_FILES.items():
            assert node_file(nodes.cluster, f"{layout.workdir}/{rel}") == text
        listing = nodes.run(0, f"cd {home_expr(layout.root)} && find . | sort")
        assert "snapshot.pt" not in listing and "checkpoint-agent" not in listing
        assert "./run/heartbeat" in listing.split()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """One loopback node for the tests below, each in a folder of its own on it."""
    home = tmp_path_factory.mktemp("steps") / "orch"
    with loopback_cluster(home, "steps-1", count=1) as cluster:
        yield cluster


def test_a_reset_that_cannot_remove_a_file_names_the_step_and_what_to_do(node) -> None:  # noqa: ANN001
    layout = NodeLayout("dev-2")
    workdir = home_expr(layout.workdir)
    manifest = json.dumps({"files": {"snapshot.pt": {}}})
    node.connections[0].run(
        f"{sync_line(layout)} && printf x > {workdir}/snapshot.pt && "
        f"mkdir -p {home_expr(layout.root)}/checkpoint-agent && printf %s '{manifest}' > "
        f"{home_expr(layout.root)}/checkpoint-agent/manifest.json && "
        f"chattr +i {workdir}/snapshot.pt"
    )
    try:
        with pytest.raises(RemoteError) as failed:
            reset_nodes(node, layout, layout.node_path("."), cluster_name="dev")
    finally:
        node.connections[0].run(f"chattr -i {workdir}/snapshot.pt")
    error = failed.value
    assert error.message.startswith("reset of kept cluster dev's nodes for this job failed: ")
    assert "cannot remove" in error.message and "snapshot.pt" in error.message
    assert "orch down dev" in (error.hint or "")
    assert node_file(node, f"{layout.workdir}/train.py") == WORKDIR_FILES["train.py"]


def test_an_agent_that_cannot_be_sent_names_the_step(node, tmp_path: Path) -> None:  # noqa: ANN001
    job = "steps-3"
    layout = NodeLayout(job)
    node.connections[0].run(f"mkdir -p {home_expr(layout.root)} && : > "
                            f"{home_expr(layout.root)}/checkpoint-agent")  # fmt: skip
    settings = Settings(home=tmp_path / "orch")
    keeper = CheckpointKeeper(
        job_id=job, checkpoint=CheckpointSpec(dir="."), node_dir=layout.node_path("."),
        mirror=CheckpointMirror(tmp_path / "mirror"), ledger=Ledger(make_engine("sqlite://")),
        settings=settings, line=lambda _text: None,
    )  # fmt: skip
    with pytest.raises(RemoteError) as failed:
        keeper.prepare(node)
    assert failed.value.message.startswith("sending the checkpoint agents to the nodes failed: ")
    assert "python3" in (failed.value.hint or "")


def test_fresh_leaves_a_stale_snapshot_out_of_the_sync_and_off_the_node(
    node,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    (work / "conf").mkdir(parents=True)
    for rel, text in WORKDIR_FILES.items():
        (work / rel).write_text(text)
    (work / "snapshot.pt").write_text("epoch 10 of a trial run here\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: tut\nworkdir: work\nrun: python train.py\ncheckpoint: {dir: .}\n")
    loaded = load_job(spec, {})
    loaded = type(loaded)(**{**vars(loaded), "left_out": ("snapshot.pt",)})
    layout = NodeLayout("tut-4")
    # an earlier job's sync on this kept node brought the stale file already
    node.connections[0].run(
        f"mkdir -p {home_expr(layout.workdir)} && printf stale > "
        f"{home_expr(layout.workdir)}/snapshot.pt"
    )
    Attempt(node.instances, node).push(loaded, layout)
    assert node_file(node, f"{layout.workdir}/train.py") == WORKDIR_FILES["train.py"]
    assert node_file(node, f"{layout.workdir}/snapshot.pt") == "stale"  # not sent
    node.connections[0].run(fresh_command(layout, loaded.left_out))
    assert node_file(node, f"{layout.workdir}/snapshot.pt") == ""
    assert node_file(node, f"{layout.workdir}/conf/base.yaml") == WORKDIR_FILES["conf/base.yaml"]
