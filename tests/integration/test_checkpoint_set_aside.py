"""Before a restart on nodes that kept their disks, the steps they hold that are newer than the
resume point and not whole everywhere are moved aside (kept under orch's folder of the job,
with a SET_ASIDE event), on real loopback nodes through the real keeper, with a `file://`
store; a checkpoint held back after a failed load is resumed no more and set aside too."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cluster.checkpoints.keeper import KeeperOptions
from orchestrator.node.set_aside_protocol import folder
from orchestrator.spec.model import CheckpointSpec
from tests.support.checkpoint_nodes import collect_until, end_run, keeper_nodes, start_run

JOB = "aside-1"


def step(directory: str, text: str, *, complete: bool = True) -> str:
    """A shell line that writes an orch-trainer step directory (COMPLETE marker last)."""
    marker = f" && : > ckpt/{directory}/COMPLETE" if complete else ""
    return f"mkdir -p ckpt/{directory} && printf '{text}' > ckpt/{directory}/state.pt{marker}"


def test_a_restart_sets_aside_what_is_newer_than_its_resume_point_and_keeps_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    store = tmp_path / "store"
    store.mkdir()
    spec = CheckpointSpec(dir="~/ckpt", store=f"file://{store}", mirror="none")
    options = KeeperOptions(pull_every=3600)
    with keeper_nodes(home, JOB, count=2, checkpoint=spec, options=options) as nodes:
        nodes.run(0, f"{step('step-000004', 'four')} && {step('step-000008', 'eight')}")
        collect_until(
            nodes,
            lambda c: (
                {"step-000004", "step-000008"}
                <= {r.name for r in nodes.ledger.checkpoints(JOB, live_only=True) if r.stored_at}
            ),
        )
        # The run's last save: step 12 half written on node 0 (no marker), a per-rank file of
        # it on node 1; both staged and uploaded, neither ever whole.
        nodes.run(0, step("step-000012", "twelve", complete=False))
        nodes.run(1, "mkdir -p ckpt/rank1 && printf r1 > ckpt/rank1/step_12.pt")
        end_run(nodes.cluster, JOB)
        nodes.keeper.finish(wait_s=30)
        uploaded = {str(p.relative_to(store)) for p in store.rglob("*@*")}
        half = {key for key in uploaded if key.startswith(f"{JOB}/step-000012/state.pt@")}
        assert len(half) == 1, uploaded  # in the store, and no record holds it

        # The restart on the same nodes: step 8 put back (and every single file the store holds,
        # rank1/step_12.pt too), step 12 and rank1/step_12.pt set aside, on every node.
        start_run(nodes.cluster, JOB)
        resume = nodes.keeper.prepare(nodes.cluster, restart=True)
        assert (resume.name, resume.step) == ("step-000008", 8)
        assert nodes.run(0, "ls ckpt; ls ckpt/rank1").split() == [
            "rank1", "step-000004", "step-000008",
        ]  # fmt: skip
        aside = nodes.run(0, f"cd {folder(JOB)} && find . -type f | sort").split()
        (tag,) = {path.split("/")[1] for path in aside}
        assert aside == [f"./{tag}/rank1/step_12.pt", f"./{tag}/step-000012/state.pt"]
        assert nodes.run(0, f"cat {folder(JOB)}/{tag}/step-000012/state.pt") == "twelve"
        assert nodes.run(1, f"cat {folder(JOB)}/*/rank1/step_12.pt") == "r1"
        assert nodes.run(1, "ls ckpt").split() == ["rank1", "step-000008"]
        assert nodes.run(1, "ls ckpt/rank1") == ""
        events = sorted(nodes.events("SET_ASIDE"))
        assert events[0].startswith(
            f"node 0: rank1/step_12.pt, step-000012 moved to ~/{folder(JOB)}/{tag}: "
        )
        assert events[1].startswith(f"node 1: rank1/step_12.pt moved to ~/{folder(JOB)}/")
        assert all("resume point (step-000008)" in e for e in events)

        # The run could not load step 8: it is held back, step 4 is resumed, step 8 set aside.
        held = nodes.keeper.hold_back()
        assert held is not None and held.name == "step-000008"
        assert nodes.keeper.newest() is not None and nodes.keeper.newest().name == "step-000004"
        end_run(nodes.cluster, JOB)
        nodes.keeper.finish(wait_s=30)
        start_run(nodes.cluster, JOB)
        resume = nodes.keeper.prepare(nodes.cluster)  # no recovery, but something held back
        assert (resume.name, resume.step) == ("step-000004", 4)
        for rank in (0, 1):
            assert nodes.run(rank, "ls ckpt").split() == ["rank1", "step-000004"]
            assert nodes.run(rank, "cat ckpt/step-000004/state.pt") == "four"
        assert len(nodes.events("SET_ASIDE")) == 4

        # The job's end: the store keeps what was set aside, and says so.
        end_run(nodes.cluster, JOB)
        nodes.keeper.finish(wait_s=30)
        nodes.keeper.sweep_store()
        assert {str(p.relative_to(store)) for p in store.rglob("*@*")} >= uploaded
        (kept,) = [e for e in nodes.events("STORE") if e.startswith("kept ")]
        assert (
            kept.startswith("kept 1 object(s) of checkpoints set aside") and "step-000012" in kept
        )
        records = {r.name: r for r in nodes.ledger.checkpoints(JOB, live_only=True)}
        files = json.loads(records["step-000008"].files_json or "[]")
        assert all((store / f["key"]).is_file() for f in files)  # held back, still kept
