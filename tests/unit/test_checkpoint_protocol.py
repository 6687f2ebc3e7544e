"""What the controller reads back from a node's checkpoint agent is trusted no further than it
checks: a manifest written (or forged) on the node cannot name a file outside the checkpoint
directory, nor a staged copy outside the agent's own."""

from __future__ import annotations

import json
import posixpath

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.node.checkpoint_protocol import (
    AgentConfig,
    parse_manifest,
    parse_report,
    restore_error,
)
from tests.support.fuzzing import examples

SHA = "ab" * 32
UNSAFE = ["../escape", "/etc/passwd", "a//b", "./x", "a/./b", "..", ".", "", "step/../../x",
          ".tmp-x/state.pt", "__pycache__/m.pyc", "bad\udcffname"]  # fmt: skip


def staged(**extra: object) -> dict:
    return {"digest": SHA, "size": 1, "mtime_ns": 5, "ctime_ns": 6, "object": SHA,
            "linked": False, "stored": None, **extra}  # fmt: skip


def document(files: dict, **extra: object) -> dict:
    return {"version": 1, "generation": 3, "files": files, "dcp": {}, "problems": [], **extra}


def test_unsafe_paths_and_forged_fields_are_dropped() -> None:
    files = {name: {"size": 1, "mtime_ns": 5, "staged": staged()} for name in UNSAFE}
    files["ok.pt"] = {"size": 1, "mtime_ns": 5, "staged": staged()}
    files["obj.pt"] = {"size": 1, "mtime_ns": 5, "staged": staged(object="../../etc/passwd")}
    files["neg.pt"] = {"size": -1, "mtime_ns": 5, "staged": staged()}
    files["bool.pt"] = {"size": True, "mtime_ns": 5, "staged": staged()}
    files["sha.pt"] = {"size": 1, "mtime_ns": 5, "staged": staged(digest="not hex")}
    manifest = parse_manifest(document(files), rank=1)
    assert manifest is not None
    assert sorted(manifest.files) == ["obj.pt", "ok.pt", "sha.pt"]  # no size, no entry
    assert manifest.files["ok.pt"].settled
    assert manifest.files["obj.pt"].staged is None  # a copy it cannot name safely
    assert manifest.files["sha.pt"].staged is None


def test_not_a_manifest_at_all() -> None:
    for bad in (None, [], "x", {"version": 99, "files": {}}, {"version": 1, "files": []}):
        parsed = parse_manifest(bad, rank=0)
        assert parsed is None or parsed.files == {}


names = st.lists(
    st.sampled_from(["..", ".", "", "a", "step-000001", "/", "~", " ", "\n", ".tmpx"]),
    min_size=1, max_size=5,
).map("/".join) | st.text(max_size=12)  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(paths=st.lists(names, max_size=8))
def test_every_parsed_path_stays_inside_the_checkpoint_directory(paths: list[str]) -> None:
    files = {p: {"size": 1, "mtime_ns": 1, "staged": staged()} for p in paths}
    manifest = parse_manifest(document(files), rank=0)
    assert manifest is not None
    root = "/orch/jobs/j/checkpoints"
    for rel in manifest.files:
        joined = posixpath.normpath(posixpath.join(root, rel))
        assert joined.startswith(root + "/"), rel
        assert posixpath.join(root, rel) == joined, rel  # nothing for the OS to resolve


def test_the_node_clock_offset_is_taken_half_way_through_the_read() -> None:
    output = f"1000500 alive\n{json.dumps(document({}))}"
    report = parse_report(output, 0, sent_ns=1000, received_ns=2000)
    assert report.agent == "alive"
    assert report.manifest is not None and report.manifest.clock_offset_ns == 1000500 - 1500
    assert parse_report("garbage", 0, 0, 0).manifest is None
    assert parse_report("123 none\n", 0, 0, 0).manifest is None


def test_a_checkpoint_dir_around_orch_s_own_tree_leaves_the_tree_out() -> None:
    home_wide = AgentConfig("j-1", 0, ".").document()  # checkpoint.dir: ~
    assert "orch-jobs" in home_wide["exclude"]
    own = AgentConfig("j-1", 0, "orch-jobs/j-1/workdir").document()  # checkpoint.dir: .
    assert "orch-jobs" not in own["exclude"]
    assert {"orch-jobs/j-1/run", "orch-jobs/j-1/checkpoint-agent"} <= set(own["exclude"])


def test_a_restore_says_what_went_wrong() -> None:
    assert restore_error("progress 1 2\nrestored 1 2 0.1\n") is None
    assert restore_error("error s3://b/k: AccessDenied\n") == "s3://b/k: AccessDenied"
    assert restore_error("") == "the restore printed nothing"
