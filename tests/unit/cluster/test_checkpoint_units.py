"""Which checkpoints count as complete, from the manifests of a job's nodes (pure)."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cluster.checkpoints.units import (
    CLOCK_SLACK_NS,
    find_units,
    present_directories,
    step_of,
)
from orchestrator.node.checkpoint_protocol import DcpListing, NodeFile, NodeManifest, StagedCopy
from tests.support.fuzzing import examples

S = 1_000_000_000


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def node_file(path: str, at: int, *, settled: bool = True, linked: bool = False, size: int = 10):
    copy = StagedCopy(sha(path + str(at)), size, at, 0, sha("obj" + path), linked, None)
    return NodeFile(path, size, at if settled else at + 5 * S, copy)


def manifest(rank: int, *files: NodeFile, dcp=None, offset: int = 0) -> NodeManifest:
    return NodeManifest(
        rank, 1, False, False, {f.path: f for f in files}, dcp or {}, (), clock_offset_ns=offset
    )


def names(units) -> list[tuple[str, str]]:
    return [(u.kind, u.name) for u in units]


def test_a_step_directory_is_complete_with_its_marker_and_every_file_settled() -> None:
    node0 = manifest(0, node_file("step-000010/state.pt", 10 * S),
                     node_file("step-000010/COMPLETE", 11 * S))  # fmt: skip
    assert names(find_units({0: node0}, [0])) == [("step", "step-000010")]
    (unit,) = find_units({0: node0}, [0])
    assert unit.files[-1].path == "step-000010/COMPLETE"  # the marker last
    assert unit.step == 10

    no_marker = manifest(0, node_file("step-000010/state.pt", 10 * S))
    assert find_units({0: no_marker}, [0]) == []  # nor is state.pt taken on its own
    changing = manifest(0, node_file("step-000010/state.pt", 10 * S, settled=False),
                        node_file("step-000010/COMPLETE", 11 * S))  # fmt: skip
    assert find_units({0: changing}, [0]) == []


def _dcp(rank0_files, rank1_files, *, expected=None, offset1: int = 0):
    meta_at = 20 * S
    metadata = node_file("ckpt/.metadata", meta_at)
    listing = DcpListing(metadata.staged.digest, expected)  # type: ignore[union-attr]
    node0 = manifest(0, metadata, *rank0_files, dcp={"ckpt": listing})
    node1 = manifest(1, *rank1_files, offset=offset1)
    return node0, node1


def test_a_dcp_checkpoint_needs_every_shard_its_metadata_names_from_every_node() -> None:
    expected = {"__0_0.distcp": 10, "__1_0.distcp": 10, "__2_0.distcp": 10, "__3_0.distcp": 10}
    node0, node1 = _dcp(
        [node_file("ckpt/__0_0.distcp", 19 * S), node_file("ckpt/__1_0.distcp", 19 * S)],
        [node_file("ckpt/__2_0.distcp", 19 * S), node_file("ckpt/__3_0.distcp", 19 * S)],
        expected=expected,
    )
    (unit,) = find_units({0: node0, 1: node1}, [0, 1])
    assert unit.kind == "dcp" and unit.name == "ckpt"
    assert {f.path: f.rank for f in unit.files} == {
        "ckpt/__0_0.distcp": 0, "ckpt/__1_0.distcp": 0, "ckpt/__2_0.distcp": 1,
        "ckpt/__3_0.distcp": 1, "ckpt/.metadata": 0,
    }  # fmt: skip
    assert unit.files[-1].path == "ckpt/.metadata"
    # Node 1 lost: its shards are nowhere, and none is taken alone either.
    assert find_units({0: node0}, [0, 1]) == []


def test_a_shard_written_after_the_metadata_is_a_save_in_progress() -> None:
    expected = {"__0_0.distcp": 10, "__1_0.distcp": 10}
    node0, node1 = _dcp(
        [node_file("ckpt/__0_0.distcp", 19 * S)],
        [node_file("ckpt/__1_0.distcp", 25 * S)],  # the next save, into the same directory
        expected=expected,
    )
    assert find_units({0: node0, 1: node1}, [0, 1]) == []


def test_node_clocks_are_compared_after_their_offset_is_taken_out() -> None:
    expected = {"__0_0.distcp": 10, "__1_0.distcp": 10}
    ahead = 7 * S  # node 1's clock runs 7 s ahead; its shard was written before the metadata
    node0, node1 = _dcp(
        [node_file("ckpt/__0_0.distcp", 19 * S)],
        [node_file("ckpt/__1_0.distcp", 19 * S + ahead)],
        expected=expected,
        offset1=ahead,
    )
    assert names(find_units({0: node0, 1: node1}, [0, 1])) == [("dcp", "ckpt")]
    late = CLOCK_SLACK_NS + S
    node0, node1 = _dcp(
        [node_file("ckpt/__0_0.distcp", 19 * S)],
        [node_file("ckpt/__1_0.distcp", 20 * S + ahead + late)],
        expected=expected,
        offset1=ahead,
    )
    assert find_units({0: node0, 1: node1}, [0, 1]) == []


def test_a_shard_shorter_than_the_metadata_says_is_not_there_yet() -> None:
    node0, node1 = _dcp(
        [node_file("ckpt/__0_0.distcp", 19 * S, size=5)], [], expected={"__0_0.distcp": 10}
    )
    assert find_units({0: node0, 1: node1}, [0, 1]) == []


def test_unreadable_metadata_needs_every_node_and_every_file_settled() -> None:
    node0, node1 = _dcp(
        [node_file("ckpt/__0_0.distcp", 19 * S)], [node_file("ckpt/__1_0.distcp", 19 * S)]
    )
    assert names(find_units({0: node0, 1: node1}, [0, 1])) == [("dcp", "ckpt")]
    assert find_units({0: node0}, [0, 1]) == []


def test_any_other_file_comes_from_the_lowest_rank_with_a_usable_copy() -> None:
    both = [manifest(r, node_file("snapshot.pt", 10 * S + r)) for r in (0, 1)]
    ((unit),) = find_units({0: both[0], 1: both[1]}, [0, 1])
    assert (unit.kind, unit.name, unit.files[0].rank) == ("file", "snapshot.pt", 0)
    # A copy (not a link) stays usable while the script writes the next version.
    busy = manifest(0, node_file("snapshot.pt", 10 * S, settled=False))
    assert names(find_units({0: busy}, [0])) == [("file", "snapshot.pt")]
    # A hard link does not: it would hold the half-written next version.
    linked = manifest(0, node_file("best/model.pt", 10 * S, settled=False, linked=True))
    assert find_units({0: linked}, [0]) == []


def test_directories_first_newest_last() -> None:
    node0 = manifest(
        0,
        node_file("step-000020/COMPLETE", 5 * S),
        node_file("step-000003/COMPLETE", 9 * S),
        node_file("latest", 9 * S),
    )
    assert names(find_units({0: node0}, [0])) == [
        ("step", "step-000003"), ("step", "step-000020"), ("file", "latest"),
    ]  # fmt: skip


def test_what_the_nodes_still_hold_is_known_only_when_all_answer() -> None:
    node0 = manifest(0, node_file("step-000001/COMPLETE", S), node_file("a/b/c.pt", S))
    assert present_directories({0: node0}, [0, 1]) is None
    assert present_directories({0: node0}, [0]) == {"step-000001", "a/b"}


def test_step_numbers_come_from_the_name() -> None:
    assert [step_of(n) for n in ("step-000120", "checkpoint-500", "ckpt/epoch_3", ".", "x")] == [
        120, 500, 3, None, None,
    ]  # fmt: skip


paths = st.sampled_from(
    ["snapshot.pt", "step-000001/state.pt", "step-000001/COMPLETE", "d/.metadata",
     "d/__0_0.distcp", "d/__1_0.distcp", "d/extra.json", "step-000002/state.pt"]
)  # fmt: skip


@settings(max_examples=examples(200), deadline=None)
@given(
    files=st.lists(
        st.tuples(st.integers(0, 1), paths, st.integers(1, 40), st.booleans(), st.booleans()),
        max_size=12,
    ),
    metadata_lists=st.booleans(),
)
def test_every_file_of_a_unit_is_a_copy_that_holds_what_was_staged(files, metadata_lists) -> None:
    by_rank: dict[int, dict[str, NodeFile]] = {0: {}, 1: {}}
    for rank, path, at, settled, linked in files:
        by_rank[rank][path] = node_file(path, at * S, settled=settled, linked=linked)
    dcp = {}
    if "d/.metadata" in by_rank[0]:
        expected = {"__0_0.distcp": 1, "__1_0.distcp": 1} if metadata_lists else None
        dcp = {"d": DcpListing(by_rank[0]["d/.metadata"].staged.digest, expected)}  # type: ignore[union-attr]
    manifests = {
        0: manifest(0, *by_rank[0].values(), dcp=dcp),
        1: manifest(1, *by_rank[1].values()),
    }
    for unit in find_units(manifests, [0, 1]):
        for f in unit.files:
            held = manifests[f.rank].files[f.path]
            assert held.usable is not None and held.usable.digest == f.digest
            if unit.kind != "file":
                assert held.settled  # directory checkpoints take only settled files
        if unit.kind == "step":
            assert any(f.path.endswith("/COMPLETE") for f in unit.files)
        if unit.kind == "dcp":
            assert unit.files[-1].path == "d/.metadata"
            meta_at = manifests[0].files["d/.metadata"].mtime_ns
            assert all(manifests[f.rank].files[f.path].mtime_ns <= meta_at for f in unit.files)
