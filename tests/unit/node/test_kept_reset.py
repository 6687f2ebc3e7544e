"""The reset of a kept node between two jobs: the path rule for every form `checkpoint.dir`
takes (pure), and the reset itself run with a real bash and python3 on a home under tmp_path,
with a checkpoint agent's manifest, symlinks and forged names. Whatever the form, the workdir,
the home and everything outside the job's folder stay; only the last job's own files go."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.node import clear_files
from orchestrator.node.clear_files import clear_rule
from orchestrator.node.clear_protocol import clear_command, parse_cleared, reset_command
from orchestrator.node.launch import NodeLayout

OWNER = "dev-1"
LAYOUT = NodeLayout(OWNER)
HOME = "/home/u"  # for the pure rule: the node's home, resolved

# checkpoint.dir as written in a spec -> (home-relative node path, what a reset makes of it)
FORMS = {
    ".": ("orch-jobs/dev-1/workdir", "files"),
    "./": ("orch-jobs/dev-1/workdir", "files"),
    "ckpt/": ("orch-jobs/dev-1/workdir/ckpt", "files"),
    "./ckpt/../": ("orch-jobs/dev-1/workdir", "files"),
    "..": ("orch-jobs/dev-1", "files"),
    "../checkpoints": ("orch-jobs/dev-1/checkpoints", "whole"),
    "../run": ("orch-jobs/dev-1/run", "whole"),
    "../..": ("orch-jobs", "outside"),
    "../../../.ssh": (".ssh", "outside"),
    "../../../..": ("..", "outside"),
    "~": (".", "outside"),
    "~/": (".", "outside"),
    "~/ckpt/": ("ckpt", "outside"),
    "~/orch-jobs/dev-1/workdir/./": ("orch-jobs/dev-1/workdir", "files"),
    "/data/ckpt/": ("/data/ckpt", "outside"),
    "//data/x/../ckpt": ("/data/ckpt", "outside"),
    "/": ("/", "outside"),
}


@pytest.mark.parametrize("written", sorted(FORMS))
def test_every_checkpoint_dir_form_is_normalised_and_classified(written: str) -> None:
    node_path, made = FORMS[written]
    assert LAYOUT.node_path(written) == node_path
    real = os.path.normpath(node_path if node_path.startswith("/") else f"{HOME}/{node_path}")
    removed = [f"{HOME}/{path}" for path in reset_request_removed()]
    assert clear_rule(real, f"{HOME}/{LAYOUT.root}", removed) == made


def test_the_default_checkpoint_dir_goes_whole() -> None:
    assert LAYOUT.node_path(None) == "orch-jobs/dev-1/checkpoints"
    removed = [f"{HOME}/{path}" for path in reset_request_removed()]
    assert clear_rule(f"{HOME}/{LAYOUT.node_path(None)}", f"{HOME}/{LAYOUT.root}", removed) == (
        "whole"
    )


def test_a_folder_beside_the_jobs_folder_is_not_inside_it() -> None:
    assert clear_rule(f"{HOME}/orch-jobs/dev-10", f"{HOME}/orch-jobs/dev-1", []) == "outside"


def reset_request_removed() -> list[str]:
    return [LAYOUT.run_dir, f"{LAYOUT.root}/checkpoint-agent", LAYOUT.default_checkpoint_dir]


# --- the reset on a real home ------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def kept_node(home: Path, listed: list[str]) -> dict[str, Path]:
    """A home as a kept node has it after a job with `dir: .`: the synced workdir plus what the
    run wrote (listed in its agent's manifest), orch's own folders, and the user's files."""
    root = home / LAYOUT.root
    files = {
        "train": write(root / "workdir/train.py", "print('train')\n"),
        "config": write(root / "workdir/conf/base.yaml", "lr: 1\n"),
        "marker": write(root / "setup.key", "k1\n"),
        "home_file": write(home / "notes.txt", "mine\n"),
        "home_ckpt": write(home / "snapshot.pt", "the user's own\n"),
        "ssh": write(home / ".ssh/authorized_keys", "ssh-ed25519 AAAA\n"),
        "log": write(root / "run/node.log", "old run\n"),
        "objects": write(root / "checkpoint-agent/objects/abc", "staged\n"),
        "default": write(root / "checkpoints/step-1/a.pt", "orch's own\n"),
    }
    write(root / "workdir/snapshot.pt", "the last job's\n")
    write(root / "workdir/step-000010/model.pt", "the last job's step\n")
    manifest = {"generation": 3, "files": {rel: {"size": 1} for rel in listed}}
    write(root / "checkpoint-agent/manifest.json", json.dumps(manifest))
    return files


def run_reset(home: Path, checkpoint_dir: str | None) -> subprocess.CompletedProcess[str]:
    command = reset_command(LAYOUT, LAYOUT.node_path(checkpoint_dir))
    return subprocess.run(
        ["bash", "-c", command], env={**os.environ, "HOME": str(home)}, cwd=home,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def unchanged(files: dict[str, Path], *names: str) -> None:
    for name in names:
        assert files[name].is_file(), name


LISTED = ["snapshot.pt", "step-000010/model.pt"]
FORGED = ["../../../notes.txt", "/etc/hostname", "../setup.key", "conf", "", ".", "a/../b"]


@pytest.mark.parametrize("checkpoint_dir", [".", "./", "~", "~/", "..", "/", "../../../.ssh"])
def test_a_reset_never_removes_the_workdir_the_home_or_anything_outside(
    tmp_path: Path, checkpoint_dir: str
) -> None:
    files = kept_node(tmp_path, LISTED + FORGED + ["notes.txt", ".ssh/authorized_keys"])
    done = run_reset(tmp_path, checkpoint_dir)
    assert done.returncode == 0, done.stderr
    unchanged(files, "train", "config", "marker", "home_file", "home_ckpt", "ssh")
    root = tmp_path / LAYOUT.root
    assert not (root / "checkpoint-agent").exists() and not (root / "checkpoints").exists()
    assert (root / "run").is_dir() and list((root / "run").iterdir()) == [root / "run/heartbeat"]
    gone = not (root / "workdir/snapshot.pt").exists()
    assert gone == (checkpoint_dir in (".", "./")), "the last job's files, and only in-job dirs"
    if checkpoint_dir == "..":  # the job's folder: listed paths are relative to it
        assert (root / "workdir/snapshot.pt").exists()


def test_with_dir_dot_only_the_last_jobs_checkpoints_go(tmp_path: Path) -> None:
    files = kept_node(tmp_path, LISTED)
    done = run_reset(tmp_path, ".")
    assert done.returncode == 0, done.stderr
    assert parse_cleared(done.stdout.splitlines()[0]).removed == 2
    workdir = tmp_path / LAYOUT.workdir
    assert sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*")) == [
        "conf", "conf/base.yaml", "train.py",
    ]  # fmt: skip
    assert files["train"].read_text() == "print('train')\n"


def test_a_symlinked_checkpoint_dir_that_leads_out_is_left_alone(tmp_path: Path) -> None:
    files = kept_node(tmp_path, ["notes.txt", "snapshot.pt"])
    (tmp_path / LAYOUT.workdir / "ckpt").symlink_to(tmp_path)  # dir: ckpt -> the home
    done = run_reset(tmp_path, "ckpt")
    assert done.returncode == 0, done.stderr
    assert parse_cleared(done.stdout.splitlines()[0]).dir == "outside"
    unchanged(files, "home_file", "home_ckpt", "train")


def test_listed_files_behind_a_symlink_or_that_are_folders_stay(tmp_path: Path) -> None:
    files = kept_node(tmp_path, ["out/notes.txt", "conf", "link.pt"])
    workdir = tmp_path / LAYOUT.workdir
    (workdir / "out").symlink_to(tmp_path)
    (workdir / "link.pt").symlink_to(tmp_path / "snapshot.pt")
    done = run_reset(tmp_path, ".")
    assert done.returncode == 0, done.stderr
    unchanged(files, "home_file", "home_ckpt", "config")
    assert (workdir / "link.pt").is_symlink()


def test_orchs_own_folders_swapped_for_symlinks_lose_only_the_link(tmp_path: Path) -> None:
    files = kept_node(tmp_path, [])
    root = tmp_path / LAYOUT.root
    outside = write(tmp_path / "data/keep.bin", "data\n").parent
    for name in ("checkpoints", "checkpoint-agent"):
        subprocess.run(["rm", "-rf", str(root / name)], check=True)
        (root / name).symlink_to(outside)
    done = run_reset(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert (outside / "keep.bin").is_file()
    assert not (root / "checkpoints").exists() and not (root / "checkpoint-agent").exists()
    unchanged(files, "train", "home_file")


def test_an_absolute_dir_that_resolves_into_the_workdir_is_cleared_file_by_file(
    tmp_path: Path,
) -> None:
    files = kept_node(tmp_path, LISTED)
    done = run_reset(tmp_path, str(tmp_path / LAYOUT.workdir))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / LAYOUT.workdir / "snapshot.pt").exists()
    unchanged(files, "train", "config")


def test_a_removal_outside_the_jobs_folder_is_refused_and_fails(tmp_path: Path) -> None:
    files = kept_node(tmp_path, [])
    request = {"root": LAYOUT.root, "remove": ["notes.txt", f"{LAYOUT.root}/../.."], "dir": None}
    done = subprocess.run(
        ["bash", "-c", clear_command(request)], env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot remove" in done.stderr and "lies outside" in done.stderr
    unchanged(files, "home_file", "train")


def test_a_node_that_never_held_the_job_has_nothing_to_reset(tmp_path: Path) -> None:
    done = run_reset(tmp_path, ".")
    assert done.returncode == 0, done.stderr
    assert parse_cleared(done.stdout.splitlines()[0]).removed == 0
    assert (tmp_path / LAYOUT.run_dir / "heartbeat").exists()


def test_a_nodes_answer_is_data() -> None:
    assert parse_cleared('{"removed": 3, "dir": "files"}').removed == 3
    assert parse_cleared('{"removed": -1, "dir": "rm -rf"}') == parse_cleared("garbage")
    assert parse_cleared("").removed == 0


def test_the_shipped_program_is_python_3_8() -> None:
    ast.parse(Path(clear_files.__file__).read_text(), feature_version=(3, 8))
