"""The rule that decides which steps the nodes must set aside before a restart: pure, over the
nodes' listings (path -> size) once the resume checkpoint was put back."""

from __future__ import annotations

import pytest

from orchestrator.cluster.checkpoints.resume_point import named_step, set_aside_plan, step_entry

SHARD = 4096


def dcp(step: int, ranks: range = range(4)) -> dict[str, int]:
    """A DCP step directory holding `.metadata` and the shards of `ranks`."""
    name = f"step-{step:06d}"
    return {f"{name}/.metadata": 700, **{f"{name}/__{r}_0.distcp": SHARD for r in ranks}}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("step-000088", ("step", 88)),
        ("step_88.pt", ("step", 88)),
        ("step_88_rank1.pt", ("step", 88)),
        ("rank8_step_8.pt", ("step", 8)),
        ("epoch=3-step=88.ckpt", ("step", 88)),  # Lightning: the step, not the epoch
        ("checkpoint-500", ("checkpoint", 500)),
        ("global_step500", ("global_step", 500)),
        ("iter_0001000", ("iter", 1000)),
        ("model_epoch_10.pt", ("epoch", 10)),
        ("Step-7", ("step", 7)),
        ("last.ckpt", None),
        ("ckpt", None),
        ("checkpoints", None),
        ("mystep5", None),  # the word must stand on its own
        ("step5x", None),  # and the number end at a separator
        ("__0_0.distcp", None),
        ("snapshot.pt", None),
    ],
)
def test_the_step_a_name_gives(name: str, expected: tuple[str, int] | None) -> None:
    assert named_step(name) == expected


def test_an_entry_is_the_path_down_to_its_first_part_naming_a_step() -> None:
    assert step_entry("step-000088/__0_0.distcp") == step_entry("step-000088/.metadata")
    entry = step_entry("run1/step-000088/__0_0.distcp")
    assert entry is not None and (entry.path, entry.family, entry.step) == (
        "run1/step-000088",
        "step",
        88,
    )
    entry = step_entry("checkpoint-500/global_step500/mp_rank_00.pt")
    assert entry is not None and entry.path == "checkpoint-500"  # the top one moves whole
    assert step_entry("rank1/step_88.pt") is not None
    assert step_entry("latest") is None and step_entry("ckpt/snapshot.pt") is None


def test_a_survivors_newer_dcp_step_goes_aside_and_the_resume_step_stays() -> None:
    # Node 0 survived with step 12's .metadata and its own shards; node 1 is new and holds
    # what was put back (step 8, whole). The run resumes step 8.
    survivor = {**dcp(4, range(2)), **dcp(8), **dcp(12, range(2)), "latest": 12}
    new = {**dcp(8), "latest": 12}
    plan = set_aside_plan({0: survivor, 1: new}, resume="step-000008")
    assert plan == {0: ("step-000012",)}  # step 4 (older, partial) stays: it is not newest


def test_in_the_resume_family_every_newer_step_goes_whole_or_not() -> None:
    # step files, per-rank files and directories alike, also when every node holds them
    both = {**dcp(8), "step_16.pt": 10, "rank1/step_12.pt": 5, "rank1/step_4.pt": 5}
    plan = set_aside_plan({0: dict(both), 1: dict(both)}, resume="step-000008")
    assert plan == {0: ("rank1/step_12.pt", "step_16.pt"), 1: ("rank1/step_12.pt", "step_16.pt")}


def test_other_families_keep_their_newest_step_that_every_node_holds_the_same() -> None:
    # Per-rank files with no directory checkpoint to resume: the controller put back what it
    # took (ranks 0 and 1 of step 88, all four of step 84) on every node. Step 88 has fewer
    # files than step 84: not whole, on any node.
    put_back = {
        **{f"ckpt_84_rank{r}.pt": 100 for r in range(4)},
        **{f"ckpt_88_rank{r}.pt": 100 for r in range(2)},
    }
    plan = set_aside_plan({0: dict(put_back), 1: dict(put_back)}, resume=None)
    assert plan == {0: ("ckpt_88_rank0.pt", "ckpt_88_rank1.pt"),
                    1: ("ckpt_88_rank0.pt", "ckpt_88_rank1.pt")}  # fmt: skip


def test_a_step_only_some_nodes_hold_is_not_whole() -> None:
    # Nothing to resume: node 0 has a DCP step the controller never held whole.
    plan = set_aside_plan({0: dcp(4, range(2)), 1: {}}, resume=None)
    assert plan == {0: ("step-000004",)}
    # ... or holds with another size on one node than on the other
    plan = set_aside_plan({0: {"epoch_3.pt": 10}, 1: {"epoch_3.pt": 11}}, resume=None)
    assert plan == {0: ("epoch_3.pt",), 1: ("epoch_3.pt",)}


def test_what_every_node_holds_the_same_stays() -> None:
    # Lightning's files, put back on every node; synced configs whose names give an epoch
    held = {
        "epoch=3-step=88.ckpt": 50,
        "epoch=4-step=110.ckpt": 50,
        "last.ckpt": 50,
        "configs/epoch_10.yaml": 3,
    }
    assert set_aside_plan({0: dict(held), 1: dict(held)}, resume=None) == {}


def test_epochs_are_not_compared_with_steps() -> None:
    # resuming step 8; an epoch-named file that every node holds is of another family
    both = {**dcp(8), "epoch_30.pt": 10}
    assert set_aside_plan({0: dict(both), 1: dict(both)}, resume="step-000008") == {}


def test_with_a_listing_not_known_whole_only_the_resume_family_is_judged() -> None:
    survivor = {**dcp(8), **dcp(12, range(2)), "epoch_3.pt": 10}
    plan = set_aside_plan({0: survivor, 1: dcp(8)}, resume="step-000008", known=False)
    assert plan == {0: ("step-000012",)}  # epoch_3.pt is on node 0 only, but unknown: stays


def test_a_held_back_step_goes_aside_from_its_own_step_on() -> None:
    # A run could not load step 8; the fallback resumes step 4; both nodes hold 8 whole.
    both = {**dcp(4), **dcp(8)}
    plan = set_aside_plan({0: dict(both), 1: dict(both)}, resume="step-000004",
                          held_back=["step-000008"])  # fmt: skip
    assert plan == {0: ("step-000008",), 1: ("step-000008",)}
    # ... also when nothing is resumed, and when the listings are not known whole
    for known in (True, False):
        plan = set_aside_plan({0: dict(both), 1: dict(both)}, resume=None, known=known,
                              held_back=["step-000008"])  # fmt: skip
        assert plan == {0: ("step-000008",), 1: ("step-000008",)}


def test_nothing_to_set_aside_on_fresh_nodes() -> None:
    assert set_aside_plan({0: dcp(8), 1: dcp(8)}, resume="step-000008") == {}
    assert set_aside_plan({0: {}, 1: {}}, resume=None) == {}
