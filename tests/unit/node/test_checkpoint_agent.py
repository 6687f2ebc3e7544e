"""The node's checkpoint agent, run in this process on a real directory: what it stages, and
that a staged copy is never torn, whatever a script does to the file meanwhile."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from orchestrator.node import checkpoint_copy, checkpoint_files
from orchestrator.node.checkpoint_agent import Agent
from orchestrator.node.checkpoint_copy import stage
from orchestrator.node.checkpoint_dcp import dcp_files
from orchestrator.node.checkpoint_files import file_digest, skipped
from orchestrator.node.checkpoint_restore import restore
from orchestrator.node.checkpoint_whole import looks_whole
from tests.support.agent_dirs import make_agent
from tests.support.waiting import wait_until


def staged(a: Agent, rel: str) -> dict | None:
    return a.files.get(rel, {}).get("staged")


def settle(a: Agent, *, ended: bool = False, timeout: float = 10.0) -> None:
    wait_until(
        lambda: a.pass_once(ended=ended), "a settled pass", timeout, interval=0.05,
        fail=lambda said: AssertionError(f"{said}; {a.files}"),
    )  # fmt: skip


@pytest.mark.parametrize(
    "rel",
    [
        ".tmp-step-000001/state.pt", "snapshot.pt.tmp", "step-000001/.metadata.tmp",
        "__pycache__/m.cpython-311.pyc", "m.pyc", "pkg.egg-info/PKG-INFO", ".git/config",
        "../x", "a//b", "./a", "bad\udcffname", "nul\x00.pt", "new\nline.pt", "tab\t.pt",
        "esc\x1b[2J.pt", "del\x7f.pt", "csi\x9b.pt", "d\x01ir/x.pt", "a" * 256,
        "/".join(["d" * 200] * 11),
    ],
)  # fmt: skip
def test_temporaries_tool_output_and_odd_names_are_never_staged(rel: str) -> None:
    assert skipped(rel)


def test_names_with_control_characters_are_reported_not_staged(tmp_path: Path) -> None:
    a = make_agent(tmp_path)
    names = ["ok.pt", "new\nline.pt", "esc\x1b[31m.pt", "tab\tname.pt", "cr\r.pt", "ü.pt"]
    for name in names:
        (tmp_path / "ckpt" / name).write_bytes(b"x")
    settle(a, ended=True)
    assert sorted(a.files) == ["ok.pt", "ü.pt"]
    problem = a.problems["names"]
    assert "new\\x0aline.pt" in problem and "esc\\x1b[31m.pt" in problem
    assert "control characters" in problem and "1 more" in problem
    assert not checkpoint_files.CONTROL.search(problem)
    for name in names[1:5]:
        (tmp_path / "ckpt" / name).unlink()
    settle(a, ended=True)
    assert "names" not in a.problems  # gone with the files


def test_shown_escapes_control_characters_and_bounds_the_length() -> None:
    assert checkpoint_files.shown("a\x00b\nc\x9bd ü") == "a\\x00b\\x0ac\\x9bd ü"
    assert len(checkpoint_files.shown("x" * 1000, 50)) == 50


@pytest.mark.parametrize("rel", ["snapshot.pt", "step-000001/COMPLETE", "a/.metadata", "..dots"])
def test_checkpoint_names_are_staged(rel: str) -> None:
    assert not skipped(rel)


def test_what_was_there_before_the_run_is_left_alone_until_it_changes(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "train.py").write_text("code")  # synced by orch
    (tmp_path / "ckpt" / "snapshot.pt").write_bytes(b"pushed back")  # restored by orch
    restored = {"snapshot.pt": {"digest": "ab" * 32, "size": 11, "key": "p/j1/snapshot.pt@ab"}}
    a = make_agent(tmp_path, restored=restored)
    settle(a)
    assert "train.py" not in a.files
    known = staged(a, "snapshot.pt")
    assert known is not None and known["restored"] and known["object"] is None
    assert known["stored"] == "p/j1/snapshot.pt@ab"
    assert os.listdir(a.objects) == []  # nothing copied for either

    time.sleep(0.01)  # on purpose: the rewrite gets a later mtime
    (tmp_path / "ckpt" / "train.py").write_text("changed by the run")
    settle(a)
    copy = staged(a, "train.py")
    assert copy is not None and not copy["linked"]
    assert (Path(a.objects) / copy["object"]).read_text() == "changed by the run"


def test_a_new_file_waits_until_it_is_quiet(tmp_path: Path) -> None:
    a = make_agent(tmp_path, quiet_s=30)
    (tmp_path / "ckpt" / "snapshot.pt").write_bytes(b"x" * 10)
    assert not a.pass_once(ended=False)
    assert staged(a, "snapshot.pt") is None
    assert a.pass_once(ended=True)  # the run ended: nothing is being written any more
    assert staged(a, "snapshot.pt") is not None


# Saves as torch.save does: a zip, truncated and written again in place, in pieces. Its format
# tells the agent whether a write is over; a file of no known format is taken on quiet time
# alone, which a writer that stalls longer than it mid-save (a loaded machine) can fool.
WRITER = """
import hashlib, io, sys, time, zipfile
path, log = sys.argv[1], sys.argv[2]
n = 0
while True:
    n += 1
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", bytes([n % 251]) * 400_000)
    body = buffer.getvalue()
    with open(log, "a") as out:
        out.write(hashlib.blake2b(body, digest_size=32).hexdigest() + "\\n")
    with open(path, "r+b" if n > 1 else "wb") as handle:  # in place, as torch.save does
        handle.truncate(0)
        for start in range(0, len(body), 40_000):
            handle.write(body[start : start + 40_000])
            handle.flush()
            # every other save stalls halfway for longer than the agent's quiet time
            time.sleep(0.3 if n % 2 == 0 and start == 200_000 else 0.002)
    time.sleep(0.25)
"""


def test_a_file_rewritten_in_place_nonstop_is_only_ever_staged_whole(tmp_path: Path) -> None:
    """A script rewrites its torch.save snapshot in place (truncate, then write in pieces)
    every quarter of a second; every copy the agent stages must be exactly one save, never torn
    or mixed, however long the writer stalls mid-save."""
    a = make_agent(tmp_path, quiet_s=0.1)
    path, log = tmp_path / "ckpt" / "snapshot.pt", tmp_path / "saves.log"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(log)])
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            a.pass_once(ended=False)
            copy = staged(a, "snapshot.pt")
            if copy is not None:
                content = (Path(a.objects) / copy["object"]).read_bytes()
                assert hashlib.blake2b(content, digest_size=32).hexdigest() == copy["digest"]
                seen.add(copy["digest"])
            time.sleep(0.02)
    finally:
        writer.kill()
        writer.wait()
    saves = set(log.read_text().split())
    assert seen <= saves, "a staged copy that no save wrote (torn or mixed)"
    assert len(seen) >= 3, "the agent should keep up with a script that saves often"


def test_a_copy_that_changed_while_it_was_copied_is_refused(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "snapshot.pt"
    src.write_bytes(b"a" * 1000)
    real = checkpoint_copy.hash_fd

    def hash_while_written(fd: int, out: int | None, **_: object) -> str | None:
        digest = real(fd, out)
        with open(src, "r+b") as handle:  # a save lands in the middle of the copy
            handle.write(b"b" * 10)
        return digest

    monkeypatch.setattr(checkpoint_copy, "hash_fd", hash_while_written)
    (tmp_path / "objects").mkdir()
    assert stage(str(src), "snapshot.pt", str(tmp_path / "objects"), link=False, tag="t") == (
        "changed while it was copied"
    )
    assert os.listdir(tmp_path / "objects") == []


def test_a_linked_copy_rewritten_in_place_is_dropped_and_staged_again(tmp_path: Path) -> None:
    a = make_agent(tmp_path)
    shard = tmp_path / "ckpt" / "step-000001" / "__0_0.distcp"
    shard.parent.mkdir()
    shard.write_bytes(b"v1" * 100)
    settle(a)
    first = staged(a, "step-000001/__0_0.distcp")
    assert first is not None and first["linked"]
    time.sleep(0.01)  # on purpose: the rewrite gets a later mtime
    shard.write_bytes(b"v2" * 100)  # in place: the staged link holds v2 now too
    a.pass_once(ended=False)
    assert staged(a, "step-000001/__0_0.distcp") is None
    settle(a)
    second = staged(a, "step-000001/__0_0.distcp")
    assert (
        second is not None
        and second["digest"] == hashlib.blake2b(b"v2" * 100, digest_size=32).hexdigest()
    )


def _zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"x" * 5000)
    return buffer.getvalue()


def test_a_torch_save_cut_short_is_not_whole(tmp_path: Path) -> None:
    whole = tmp_path / "whole.pt"
    whole.write_bytes(_zip_bytes())
    torn = tmp_path / "torn.pt"
    torn.write_bytes(_zip_bytes()[:-30])  # no end of central directory yet
    assert looks_whole(str(whole), "whole.pt")
    assert not looks_whole(str(torn), "torn.pt")


def test_a_safetensors_file_must_hold_what_its_header_says(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    body = len(header).to_bytes(8, "little") + header + b"\0" * 16
    (tmp_path / "ok.safetensors").write_bytes(body)
    (tmp_path / "short.safetensors").write_bytes(body[:-4])
    assert looks_whole(str(tmp_path / "ok.safetensors"), "ok.safetensors")
    assert not looks_whole(str(tmp_path / "short.safetensors"), "short.safetensors")


def test_a_torn_file_is_reported_once_and_not_staged(tmp_path: Path) -> None:
    a = make_agent(tmp_path)
    (tmp_path / "ckpt" / "model.pt").write_bytes(_zip_bytes()[:-30])
    a.pass_once(ended=True)
    assert staged(a, "model.pt") is None
    assert any("not whole" in p for p in a.problems.values())


def test_the_dcp_metadata_names_every_shard_and_its_least_size(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    state = {"a": torch.arange(100.0), "b": {"c": torch.ones(3, 4)}, "step": 7}
    dcp.save(state, checkpoint_id=str(tmp_path / "step-000007"))
    metadata = (tmp_path / "step-000007" / ".metadata").read_bytes()
    files = dcp_files(metadata)
    assert files is not None and set(files) == {"__0_0.distcp"}
    assert 0 < files["__0_0.distcp"] <= (tmp_path / "step-000007" / "__0_0.distcp").stat().st_size


class _Boom:
    def __reduce__(self) -> tuple:
        return (os.system, ("touch /tmp/orch-agent-pickle-ran",))


def test_reading_dcp_metadata_runs_nothing_it_names(tmp_path: Path) -> None:
    sentinel = Path("/tmp/orch-agent-pickle-ran")
    sentinel.unlink(missing_ok=True)
    hostile = pickle.dumps({"storage_data": {"k": _Boom()}})
    assert dcp_files(hostile) is None
    assert not sentinel.exists()
    assert dcp_files(b"not a pickle") is None


def test_files_put_back_from_the_mirror_do_not_hold_up_the_agent_s_end(tmp_path: Path) -> None:
    """A step pushed back from the controller's mirror, never in the store: the agent has no
    copy of it to upload, so the end of the run must not wait for one (the controller's final
    collection waited its whole 60 s for such an agent, every node billing)."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "snapshot.pt").write_bytes(b"pushed back")
    restored = {"snapshot.pt": {"digest": "ab" * 32, "size": 11}}  # no store key
    a = make_agent(tmp_path, restored=restored, store={"url": f"file://{tmp_path / 'store'}"})
    (tmp_path / "run" / "exit_code").write_text("0")
    ended = threading.Thread(target=a.loop, daemon=True)
    ended.start()
    ended.join(timeout=10)
    assert not ended.is_alive(), a.files
    manifest = json.loads((tmp_path / "state" / "manifest.json").read_text())
    assert manifest["done"] is True
    assert manifest["files"]["snapshot.pt"]["staged"]["stored"] is None


def test_the_agent_uploads_every_staged_copy_and_restore_brings_it_back(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    a = make_agent(tmp_path, store={"url": f"file://{store_dir}"})
    (tmp_path / "ckpt" / "snapshot.pt").write_bytes(b"weights")
    (tmp_path / "run" / "exit_code").write_text("0")
    a.loop()  # the run ended: stage, upload, write the last manifest, exit
    manifest = json.loads((tmp_path / "state" / "manifest.json").read_text())
    assert manifest["done"] is True
    copy = manifest["files"]["snapshot.pt"]["staged"]
    key = copy["stored"]
    assert key == f"j1/snapshot.pt@{copy['digest'][:16]}"
    assert (store_dir / key).read_bytes() == b"weights"
    assert (tmp_path / "state" / "events").read_text().split()[-1] == str(manifest["generation"])

    new_node = tmp_path / "new" / "ckpt"
    plan = {
        "checkpoint_dir": str(new_node),
        "store": {"url": f"file://{store_dir}"},
        "files": [{"path": "snapshot.pt", "key": key, "size": 7, "digest": copy["digest"]}],
    }
    out = io.StringIO()
    assert restore(plan, out) == 0, out.getvalue()
    assert (new_node / "snapshot.pt").read_bytes() == b"weights"
    assert out.getvalue().splitlines()[-1].startswith("restored 1 7 ")

    (store_dir / key).write_bytes(b"tampered")
    (new_node / "snapshot.pt").unlink()
    out = io.StringIO()
    assert restore(plan, out) == 1
    assert "digest is not the one recorded" in out.getvalue()
    assert not (new_node / "snapshot.pt").exists()


def test_restore_keeps_a_file_the_node_holds_as_recorded_and_fetches_the_rest(
    tmp_path: Path,
) -> None:
    """A node that stayed through a recovery holds its shard already: no download for it."""
    store_dir = tmp_path / "store"
    (store_dir / "j1").mkdir(parents=True)
    shards = {"step-4/__0_0.distcp": b"rank 0 shard", "step-4/__1_0.distcp": b"rank 1 shard"}
    files = []
    for index, (rel, data) in enumerate(shards.items()):
        source = tmp_path / f"source-{index}"
        source.write_bytes(data)
        key = f"j1/{index}"
        (store_dir / key).write_bytes(data)
        files.append(
            {"path": rel, "key": key, "size": len(data), "digest": file_digest(str(source))}
        )
    node = tmp_path / "survivor" / "ckpt"
    (node / "step-4").mkdir(parents=True)
    (node / "step-4" / "__0_0.distcp").write_bytes(b"rank 0 shard")  # its own, as recorded
    (store_dir / "j1" / "0").write_bytes(b"corrupted!!!")  # fetched, it would fail the digest
    plan = {"checkpoint_dir": str(node), "store": {"url": f"file://{store_dir}"}, "files": files}
    out = io.StringIO()
    assert restore(plan, out) == 0, out.getvalue()
    assert (node / "step-4" / "__1_0.distcp").read_bytes() == b"rank 1 shard"
    assert out.getvalue().splitlines()[-1].startswith("restored 2 24 ")
    (node / "step-4" / "__0_0.distcp").write_bytes(b"rank 0 SHARD")  # same size, other bytes
    out = io.StringIO()
    assert restore(plan, out) == 1  # not as recorded: fetched, and the store's is bad
    assert "digest is not the one recorded" in out.getvalue()


@pytest.mark.parametrize("form", ["~", "~/", "link", "dotdot"])
def test_a_home_wide_checkpoint_dir_leaves_orchs_own_tree_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """`dir: ~` (and a path to the home through a symlink or a `..`): the agent's root is the
    home, and orch's own folders below it (the synced workdir, the run, the agent's staged
    copies) are no checkpoints of the run."""
    from orchestrator.node.checkpoint_protocol import AgentConfig
    from orchestrator.node.launch import NodeLayout

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "link").symlink_to(home)
    written = {
        "~": "~", "~/": "~/", "link": str(tmp_path / "link"),
        "dotdot": f"{home}/orch-jobs/../.",
    }[form]  # fmt: skip
    for rel in (
        "orch-jobs/j/workdir/train.py", "orch-jobs/j/run/node.log",
        "orch-jobs/j/checkpoint-agent/objects/0a1b", "orch-jobs/j/checkpoints/x.pt",
    ):  # fmt: skip
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("orch's own\n")
    (home / "snapshot.pt").write_text("the run's\n")
    document = AgentConfig("j", 0, NodeLayout("j").node_path(written)).document()
    agent = Agent(json.loads(json.dumps(document)))
    assert set(checkpoint_files.scan(agent.root, agent.exclude)) == {"snapshot.pt"}
