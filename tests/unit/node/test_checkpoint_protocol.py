"""What the controller reads back from a node's checkpoint agent is trusted no further than it
checks: a manifest written (or forged) on the node cannot name a file outside the checkpoint
directory, nor a staged copy outside the agent's own."""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.node import runtime
from orchestrator.node.checkpoint_files import CONTROL
from orchestrator.node.checkpoint_protocol import (
    MAX_NOTICES,
    AgentConfig,
    StoreKeys,
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


def test_the_agent_in_the_node_runtime_holds_every_module_it_imports(tmp_path: Path) -> None:
    """On a node the agent is a program of the node runtime, nothing of orch installed: it
    starts (its imports resolve among what the zipapp holds) from that one file alone."""
    zipapp = tmp_path / runtime.file_name()
    zipapp.write_bytes(runtime.build())
    result = subprocess.run(
        [sys.executable, "-S", str(zipapp), "checkpoint-agent", "--help"], cwd=tmp_path,
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    imported = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(zipapp)!r}); "
         "import checkpoint_agent; "
         "print(sorted(m for m in sys.modules if m.startswith(('checkpoint', 'orch', 'node'))))"],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    shipped = sorted(
        name.removesuffix(".py")
        for name in runtime.MODULES
        if name.startswith(("checkpoint", "node_kit"))
    )
    assert imported.stdout.strip() == str(shipped), imported.stderr


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


CONTROLLED = ["nul\x00.pt", "new\nline.pt", "esc\x1b[31m.pt", "del\x7f.pt", "c1\x9b.pt",
              "dir\x01/x.pt"]  # fmt: skip


def test_paths_with_control_characters_are_refused_with_a_notice_each() -> None:
    files = {p: {"size": 1, "mtime_ns": 5, "staged": staged()} for p in [*CONTROLLED, "ok.pt"]}
    dcp = {"d\x00": {"metadata_digest": SHA, "files": {}}}
    manifest = parse_manifest(document(files, dcp=dcp), rank=2)
    assert manifest is not None and sorted(manifest.files) == ["ok.pt"]
    assert manifest.dcp == {}
    assert len(manifest.refused) == len(CONTROLLED) + 1
    for notice in manifest.refused:
        assert notice.message.startswith("node 2: ") and "control characters" in notice.message
        assert not CONTROL.search(notice.message)
    assert any("nul\\x00.pt" in n.message for n in manifest.refused)


def test_a_dcp_listing_naming_a_shard_with_control_characters_refuses_the_checkpoint() -> None:
    listing = {"metadata_digest": SHA, "files": {"__0_0.distcp": 1, "__1_0\n.distcp": 1}}
    manifest = parse_manifest(document({}, dcp={"ck": listing, "ok": {**listing, "files": {}}}), 0)
    assert manifest is not None and set(manifest.dcp) == {"ok"}
    (notice,) = manifest.refused
    assert "DCP checkpoint 'ck'" in notice.message and "__1_0\\x0a.distcp" in notice.message


def test_notices_of_one_manifest_are_bounded() -> None:
    files = {f"bad{i}\x00": {"size": 1, "mtime_ns": 5, "staged": staged()} for i in range(500)}
    manifest = parse_manifest(document(files), rank=0)
    assert manifest is not None and len(manifest.refused) == MAX_NOTICES + 1
    assert "more refused entries" in manifest.refused[-1].message


KEYS = StoreKeys("team/runs", "job-1")


def test_a_stored_copy_has_the_key_the_controller_computes_never_the_node_s() -> None:
    honest = KEYS.key("w.pt", SHA)
    assert honest == f"team/runs/job-1/w.pt@{SHA[:16]}"
    claims = {"w.pt": honest, "a.pt": "../../etc/passwd", "b.pt": "/etc/passwd",
              "c.pt": "team/runs/job-2/c.pt@" + SHA[:16], "d.pt": ["not", "a", "key"],
              "e.pt": None}  # fmt: skip
    files = {p: {"size": 1, "mtime_ns": 5, "staged": staged(stored=k)} for p, k in claims.items()}
    manifest = parse_manifest(document(files), rank=0, keys=KEYS)
    assert manifest is not None
    stored = {p: f.staged.stored for p, f in manifest.files.items() if f.staged}
    assert stored == {"w.pt": honest, "a.pt": None, "b.pt": None, "c.pt": None, "d.pt": None,
                      "e.pt": None}  # fmt: skip
    assert sorted(n.about.split(":")[1] for n in manifest.refused) == ["a.pt", "b.pt", "c.pt",
                                                                       "d.pt"]  # fmt: skip
    (notice,) = [n for n in manifest.refused if "a.pt" in n.about]
    assert "'../../etc/passwd'" in notice.message
    assert KEYS.key("a.pt", SHA) in notice.message
    # Without a store nothing counts as stored, whatever the node says.
    bare = parse_manifest(document(files), rank=0)
    assert bare is not None and all(f.staged.stored is None for f in bare.files.values())


@pytest.mark.parametrize(
    "key",
    ["team/runs/job-1/../job-2/w.pt@0", "team/runs/job-1/./w.pt", "team/runs/job-1//w.pt",
     "/team/runs/job-1/w.pt", "team/runs/job-10/w.pt", "team/runs/job-1", "team/runs/job-1/",
     "team/runs/job-1/w\x00.pt", "team/runs/job-1/w\n.pt", "other/job-1/w.pt", "", None, 7,
     "team/runs/job-1/" + "x" * 300],
)  # fmt: skip
def test_keys_outside_the_job_or_not_canonical_are_not_the_job_s(key: object) -> None:
    assert not KEYS.owns(key)


def test_the_job_s_own_keys_are_its_own() -> None:
    assert KEYS.owns("team/runs/job-1/step-000001/w.pt@0123456789abcdef")
    assert StoreKeys("", "job-1").owns("job-1/w.pt@0123456789abcdef")
    assert StoreKeys.of("s3://bucket/team/runs/", "job-1") == KEYS
    assert StoreKeys.of("file:///srv/ckpt", "job-1").base == "job-1"


@settings(max_examples=examples(300), deadline=None)
@given(key=st.text(max_size=40).map(lambda rest: "team/runs/job-1/" + rest))
def test_an_owned_key_stays_under_the_job_s_prefix_wherever_it_is_joined(key: str) -> None:
    if KEYS.owns(key):
        root = "/store"
        joined = posixpath.normpath(posixpath.join(root, key))
        assert joined.startswith(f"{root}/team/runs/job-1/"), key
        assert not CONTROL.search(key)


def test_a_digest_with_a_trailing_newline_is_no_digest() -> None:
    files = {"w.pt": {"size": 1, "mtime_ns": 5, "staged": staged(digest=SHA + "\n")}}
    manifest = parse_manifest(document(files), rank=0)
    assert manifest is not None and manifest.files["w.pt"].staged is None


@pytest.mark.parametrize(
    "output",
    ["\u00b2 alive\n{}", "1" * 5000 + " alive\n{}", "12 alive\n" + "[" * 100_000,
     "12 alive\n" + '{"version": 1, "generation": ' + "9" * 5000 + "}", "12 zombie\n{}"],
)  # fmt: skip
def test_odd_reports_are_no_manifest_never_an_exception(output: str) -> None:
    report = parse_report(output, 0, 0, 0)
    assert report.manifest is None or report.manifest.generation == 0


def test_the_agent_s_problems_are_printable() -> None:
    manifest = parse_manifest(document({}, problems=["disk \x1b[2Jfull\x00", {"x": 1}]), 0)
    assert manifest is not None
    assert manifest.problems == ("disk \\x1b[2Jfull\\x00", "{'x': 1}")
