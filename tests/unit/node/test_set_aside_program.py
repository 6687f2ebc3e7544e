"""The node program that lists a checkpoint directory and moves entries out of it
(`orchestrator.node.set_aside`), run as the controller runs it (the node runtime's
`set-aside VERB`, the request on stdin) on real directories with HOME set to a temporary one
that holds the runtime; and the parsers of its answers, which trust nothing a node prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.node import runtime
from orchestrator.node.set_aside_protocol import (
    MAX_LISTED,
    folder,
    list_command,
    list_request,
    move_command,
    move_request,
    parse_listing,
    parse_moves,
)

OWNER = "job-1"


def run(home: Path, command: str, request: str) -> str:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    result = subprocess.run(
        ["bash", "-c", command], input=request, env=env, capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    return result.stdout


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    ckpt = home / "ckpt"
    (ckpt / "step-000008").mkdir(parents=True)
    (ckpt / "step-000008" / ".metadata").write_bytes(b"m" * 7)
    (ckpt / "step-000012").mkdir()
    (ckpt / "step-000012" / "__0_0.distcp").write_bytes(b"s" * 5)
    (ckpt / "rank1").mkdir()
    (ckpt / "rank1" / "step_12.pt").write_bytes(b"r")
    (ckpt / "step-000012" / ".tmp-part").write_bytes(b"t")  # a temporary: not listed
    (ckpt / "__pycache__").mkdir()
    (ckpt / "__pycache__" / "x.pyc").write_bytes(b"c")
    outside = home / "elsewhere"
    outside.mkdir()
    (outside / "secret.pt").write_bytes(b"x")
    (ckpt / "linked").symlink_to(outside)  # never followed, never listed
    (ckpt / "link.pt").symlink_to(outside / "secret.pt")
    run(home, runtime.install_command(), runtime.install_input())  # as the agents' sending does
    return home


def test_the_listing_names_the_regular_files_but_links_temporaries_and_orchs_own(
    home: Path,
) -> None:
    run_dir = home / "orch-jobs" / OWNER / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "node.log").write_text("log")
    listing = parse_listing(run(home, list_command(), list_request(OWNER, ".")))
    assert listing is not None and listing.complete
    # `ckpt` as given, and the home itself as the checkpoint directory: orch-jobs is left out
    assert listing.files == {
        "ckpt/step-000008/.metadata": 7,
        "ckpt/step-000012/__0_0.distcp": 5,
        "ckpt/rank1/step_12.pt": 1,
        "elsewhere/secret.pt": 1,
    }
    short = parse_listing(run(home, list_command(), list_request(OWNER, "ckpt", limit=2)))
    assert short is not None and not short.complete and len(short.files) == 2


def test_moved_entries_keep_their_path_under_a_new_folder_of_orchs_own(home: Path) -> None:
    entries = ["step-000012", "rank1/step_12.pt"]
    output = run(home, move_command(), move_request(OWNER, "ckpt", entries, "20250101T000000Z"))
    moves = parse_moves(output, entries, "20250101T000000Z")
    assert moves.folder == "20250101T000000Z" and moves.moved == tuple(sorted(entries))
    assert moves.failed == ()
    aside = home / folder(OWNER) / "20250101T000000Z"
    assert (aside / "step-000012" / "__0_0.distcp").read_bytes() == b"s" * 5
    assert (aside / "step-000012" / ".tmp-part").exists()  # the entry moves whole
    assert (aside / "rank1" / "step_12.pt").read_bytes() == b"r"
    assert not (home / "ckpt" / "step-000012").exists()
    assert (home / "ckpt" / "rank1").is_dir()  # only the entry, not its parent
    assert (home / "ckpt" / "step-000008" / ".metadata").exists()
    # The same tag again: a folder of its own, never mixed with the first
    (home / "ckpt" / "step-000016").mkdir()
    again = run(
        home, move_command(), move_request(OWNER, "ckpt", ["step-000016"], "20250101T000000Z")
    )
    assert parse_moves(again, ["step-000016"], "20250101T000000Z").folder == "20250101T000000Z-1"


def test_nothing_is_moved_through_a_symlink_or_from_outside(home: Path) -> None:
    entries = ["linked/secret.pt", "link.pt", "../elsewhere", "step-000099"]
    output = run(home, move_command(), move_request(OWNER, "ckpt", entries, "t1"))
    moves = parse_moves(output, entries, "t1")
    assert moves.moved == ()
    assert {entry for entry, _why in moves.failed} == set(entries)
    assert all("symlink" in why for _entry, why in moves.failed)
    assert (home / "elsewhere" / "secret.pt").exists() and (home / "ckpt" / "link.pt").is_symlink()


def test_a_folder_inside_the_checkpoint_directory_is_refused(home: Path) -> None:
    # a home-wide checkpoint directory `orch-jobs/<owner>` itself (an absolute spec path)
    ckpt = home / "orch-jobs" / OWNER
    (ckpt / "step-000004").mkdir(parents=True)
    output = run(home, move_command(), move_request(OWNER, str(ckpt), ["step-000004"], "t1"))
    moves = parse_moves(output, ["step-000004"], "t1")
    assert moves.folder is None and moves.moved == ()
    assert (ckpt / "step-000004").is_dir()


def test_across_filesystems_an_entry_is_copied_whole_then_removed(home: Path) -> None:
    other = Path("/dev/shm") / f"orch-set-aside-{os.getpid()}"  # a tmpfs: another filesystem
    assert os.stat("/dev/shm").st_dev != os.stat(home).st_dev
    try:
        (other / "step-000020").mkdir(parents=True)
        (other / "step-000020" / "state.pt").write_bytes(b"w" * 100)
        output = run(home, move_command(), move_request(OWNER, str(other), ["step-000020"], "t2"))
        assert parse_moves(output, ["step-000020"], "t2").moved == ("step-000020",)
        moved = home / folder(OWNER) / "t2" / "step-000020" / "state.pt"
        assert moved.read_bytes() == b"w" * 100
        assert not (other / "step-000020").exists()
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_listing_keeps_only_safe_paths_and_numbers() -> None:
    document = {
        "files": {
            "step-000008/.metadata": 7,
            "../etc/passwd": 1,
            "/abs": 1,
            "bad\nname": 1,
            "neg": -1,
            "flag": True,
            "str": "9",
        },
        "more": False,
    }
    listing = parse_listing(json.dumps(document))
    assert listing is not None and listing.files == {"step-000008/.metadata": 7}
    assert not listing.complete  # what was dropped makes it unknown, not smaller
    assert parse_listing("not json") is None and parse_listing('{"files": []}') is None
    assert parse_listing("x" * (33 * 2**20)) is None
    many = json.dumps({"files": {f"f{i}": 1 for i in range(MAX_LISTED + 5)}, "more": False})
    big = parse_listing(many)
    assert big is not None and len(big.files) == MAX_LISTED and not big.complete


def test_moves_count_only_what_was_asked() -> None:
    output = json.dumps(
        {
            "folder": "../../evil",
            "moved": ["step-000012", "step-000099", "/etc"],
            "failed": [["rank1/step_12.pt", "No space left on device\x1b[2J"]],
        }
    )
    moves = parse_moves(output, ["step-000012", "rank1/step_12.pt"], "t1")
    assert moves.folder is None  # not the tag it was given
    assert moves.moved == ("step-000012",)
    assert moves.failed == (("rank1/step_12.pt", "No space left on device\\x1b[2J"),)
    silent = parse_moves("", ["step-000012"], "t1")
    assert silent.moved == () and silent.failed == (("step-000012", "the node did not say"),)
