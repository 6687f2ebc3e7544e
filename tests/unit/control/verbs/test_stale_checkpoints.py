"""Workdir files a run may take for a checkpoint: which ones `orch submit` names (real rsync
decides what a sync sends, `.gitignore` and `.orchignore` included), the warning it prints at
a submit and a dry run (human and --json), and the rsync rules that leave them out with
`--fresh`, checked with a real rsync."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.control.process.controllers import load_job_record, save_job_record
from orchestrator.control.verbs.stale_files import (
    StaleCheckpoints,
    StaleFile,
    local_checkpoint_dir,
    looks_like_checkpoint,
    stale_files,
)
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.listing import synced_files
from orchestrator.remote.sync import push_argv
from orchestrator.spec.loading import load_job
from tests.support.in_process import run_main

THREE_DAYS = 3 * 86400


@pytest.mark.parametrize(
    ("written", "where"),
    [(".", ""), ("./", ""), ("ckpt/", "ckpt"), ("./a/../ckpt", "ckpt"), ("out/ckpt", "out/ckpt"),
     ("~", None), ("~/ckpt", None), ("/data/ckpt", None), ("..", None), ("../x", None),
     (None, None)],
)  # fmt: skip
def test_where_checkpoint_dir_lies_in_the_synced_workdir(written: str | None, where: str) -> None:
    assert local_checkpoint_dir(written) == where


@pytest.mark.parametrize(
    ("rel", "own_folder", "taken"),
    [
        ("snapshot.pt", False, True),
        ("model.safetensors", False, True),
        ("lightning_logs/version_0/checkpoints/epoch=3-step=88.ckpt", False, True),
        ("step-000010/model.bin", False, True),
        ("checkpoint-500/trainer_state.json", False, True),
        ("ckpt/__0_0.distcp", False, True),
        ("snapshot_train.py", False, False),
        ("data/train.csv", False, False),
        ("notes.txt", True, True),  # in a folder of its own, any file
        ("__pycache__/x.pyc", True, False),
        (".tmp-save.pt", False, False),
        ("ckpt/.orchignore", False, False),
    ],
)
def test_what_looks_like_a_checkpoint(rel: str, own_folder: bool, taken: bool) -> None:
    assert looks_like_checkpoint(rel, own_folder=own_folder) is taken


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    for rel, text in {
        "train.py": "print()\n", "snapshot.pt": "epoch 10\n", "a b [1].pt": "x\n",
        "ckpt/old.pt": "x\n", "ckpt/keep/notes.md": "x\n", "logs/run.pt": "ignored\n",
        "ckpt/ignored.pt": "x\n",
    }.items():  # fmt: skip
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    (work / ".gitignore").write_text("logs/\n")
    (work / "ckpt/.orchignore").write_text("ignored.pt\n")
    old = time.time() - THREE_DAYS
    os.utime(work / "snapshot.pt", (old, old))
    return work


def test_the_sync_decides_what_is_named(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    whole = synced_files(work)
    assert whole is not None and "logs/run.pt" not in whole and "snapshot.pt" in whole
    found = stale_files(work, "", whole)
    # `ckpt/` is a folder named for checkpoints: every file in it is named
    assert [f.path for f in found] == [
        "a b [1].pt", "ckpt/keep/notes.md", "ckpt/old.pt", "snapshot.pt",
    ]  # fmt: skip
    (snapshot,) = [f for f in found if f.path == "snapshot.pt"]
    assert abs((datetime.now(UTC) - snapshot.modified_at).total_seconds() - THREE_DAYS) < 60
    ckpt = synced_files(work, "ckpt")
    assert sorted(ckpt or []) == ["ckpt/.orchignore", "ckpt/keep/notes.md", "ckpt/old.pt"]
    assert [f.path for f in stale_files(work, "ckpt", ckpt or [])] == [
        "ckpt/keep/notes.md", "ckpt/old.pt",
    ]  # fmt: skip


def test_the_warning_names_each_file_its_age_and_both_ways_out() -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    files = (StaleFile("snapshot.pt", 524_288, now - timedelta(days=3)),)
    stale = StaleCheckpoints(".", files, fresh=False)
    assert "checkpoint.dir ." in stale.headline() and "resumes from them" in stale.headline()
    assert stale.lines(now) == ["snapshot.pt  524.3 KB, modified 3.0 days ago"]
    assert "--fresh" in (stale.hint or "") and ".orchignore" in (stale.hint or "")
    assert stale.event(now)[0] == "WARNING"
    left = StaleCheckpoints(".", files, fresh=True)
    assert left.event(now)[0] == "LEFT_OUT" and left.hint is None
    assert left.as_dict(now)["files"] == [
        {"path": "snapshot.pt", "size": 524_288, "modified_at": "2026-12-03T12:00:00Z",
         "age_s": THREE_DAYS}
    ]  # fmt: skip


def test_left_out_files_are_not_sent_by_a_real_rsync(tmp_path: Path) -> None:
    """The rules `push_argv` gives rsync for `--fresh`, run by a real rsync into a folder:
    names with spaces and wildcards are left out exactly, nothing else is."""
    work = workdir(tmp_path)
    (work / "a b [2].pt").write_text("x\n")  # `[1]` as a pattern would match it
    identity = Identity(tmp_path / "k", "ssh-ed25519 AAAA", tmp_path / "kh", tmp_path / "c")
    argv = push_argv(
        work, HostAddress("n", "10.0.0.1", 22, "u", "key"), identity, "w",
        workdir=True, leave_out=["snapshot.pt", "a b [1].pt", "ckpt/old.pt"],
    )  # fmt: skip
    rules = [arg for arg in argv if arg.startswith(("--exclude=", "--filter="))]
    target = tmp_path / "node"
    subprocess.run(["rsync", "-r", *rules, f"{work}/", f"{target}/"], check=True)
    sent = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert sent == [
        ".gitignore", "a b [2].pt", "ckpt/.orchignore", "ckpt/keep/notes.md", "train.py",
    ]  # fmt: skip


def test_the_job_record_keeps_what_the_sync_leaves_out(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\nworkdir: work\nrun: python train.py\n")
    loaded = load_job(spec, {})
    settings = Settings(home=tmp_path / "orch")
    save_job_record(settings, "j-1", type(loaded)(**{**vars(loaded), "left_out": ("x.pt",)}))
    assert load_job_record(settings, "j-1").left_out == ("x.pt",)
    assert work.is_dir()


# --- at the command line ---------------------------------------------------------------------


@pytest.fixture
def submit_env(tmp_path: Path, orch_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("ORCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ORCH_HOME", str(orch_home))
    monkeypatch.setenv("COLUMNS", "200")
    workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: tut\nworkdir: work\nrun: python train.py\ncheckpoint: {dir: .}\n"
        "resources: {nodes: 1, gpus_per_node: 1}\n"
    )
    return spec


def test_a_dry_run_warns_about_a_stale_snapshot_and_names_the_ways_out(submit_env: Path) -> None:
    code, out, err = run_main(["submit", str(submit_env), "--dry-run"])
    assert code == 0, out + err
    text = " ".join(err.split())
    assert "warning: 4 file(s) in the workdir under checkpoint.dir ." in text
    assert "snapshot.pt 9 B, modified 3.0 days ago" in text
    assert "--fresh" in text and ".orchignore" in text
    assert "would launch" in out and "snapshot.pt" not in out


def test_a_dry_run_in_json_lists_them_with_their_age(submit_env: Path) -> None:
    code, out, err = run_main(["submit", str(submit_env), "--dry-run", "--json"])
    assert code == 0, out + err
    stale = json.loads(out)["stale_checkpoints"]
    assert stale["checkpoint_dir"] == "." and stale["left_out"] is False
    (snapshot,) = [f for f in stale["files"] if f["path"] == "snapshot.pt"]
    assert abs(snapshot["age_s"] - THREE_DAYS) < 60 and snapshot["size"] == 9
    code, out, err = run_main(["submit", str(submit_env), "--dry-run", "--json", "--fresh"])
    assert json.loads(out)["stale_checkpoints"]["left_out"] is True
    assert "left out of the sync (--fresh)" in err


def test_an_orchignored_snapshot_is_not_named(submit_env: Path) -> None:
    work = submit_env.parent / "work"
    (work / ".orchignore").write_text("*.pt\nckpt/\n")
    code, out, err = run_main(["submit", str(submit_env), "--dry-run", "--json"])
    assert code == 0, out + err
    assert "stale_checkpoints" not in json.loads(out) and "warning" not in err
