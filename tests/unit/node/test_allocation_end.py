"""The `allocation-end` node program's pure parts and its authorized_keys rewrite: which homes
and markers it takes, which lines go (the others byte for byte), and its place in the node
runtime. Its processes and files on a real node: tests/integration/test_node_allocations.py."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from orchestrator.node import allocation_end, runtime, runtime_main
from orchestrator.node.allocation_end import (
    allocation_end_command,
    refusal,
    remove_key_lines,
    without_marker,
)

LOGIN = "/home/lab"
HOME = f"{LOGIN}/.orch-fleet/s-0123456789ab"
MARKER = "orch-allocation:s-0123456789ab"


@pytest.mark.parametrize("env_home", [None, HOME, LOGIN, LOGIN + "/"])
def test_an_allocation_home_with_its_own_marker_is_taken(env_home: str | None) -> None:
    assert refusal(HOME, MARKER, env_home) is None


@pytest.mark.parametrize(
    ("home", "marker", "env_home"),
    [
        ("relative/.orch-fleet/s-1", "orch-allocation:s-1", None),
        (f"{LOGIN}/.orch-fleet/s-1/../s-2", "orch-allocation:s-2", None),  # not normalised
        (f"{LOGIN}/.orch-fleet/cache", "orch-allocation:cache", None),  # the shared caches
        (f"{LOGIN}/.orch-fleet", "orch-allocation:.orch-fleet", None),
        (LOGIN, "orch-allocation:lab", None),
        (f"{LOGIN}/elsewhere/s-1", "orch-allocation:s-1", None),
        (HOME, "orch-allocation:s-999999999999", None),  # another allocation's line
        (HOME, "orch-allocation:", None),
        (HOME, MARKER, "/home/other"),  # not under this login's ~/.orch-fleet
    ],
)
def test_anything_else_is_refused(home: str, marker: str, env_home: str | None) -> None:
    assert refusal(home, marker, env_home) is not None


def test_only_the_lines_ending_in_the_marker_go_the_others_byte_for_byte() -> None:
    others = (
        b"ssh-ed25519 AAAA1 me@laptop\r\n"
        b'from="10.0.0.1" ssh-rsa AAAA2 orch-allocation:s-0123456789abc\n'  # a longer id
        b"# orch-allocation:s-0123456789ab in a comment, not at the end\n"
        b"\n"
        b"ssh-ed25519 AAAA3 orch-allocation:s-aaaaaaaaaaaa\n"
    )
    mine = b"ssh-ed25519 AAAA4 orch-allocation:s-0123456789ab\n"
    text = mine + others + b"ssh-ed25519 AAAA5 orch-allocation:s-0123456789ab"
    kept, removed = without_marker(text, MARKER)
    assert removed == 2 and kept == others


def test_the_rewrite_keeps_the_files_mode_and_follows_a_linked_file(tmp_path: Path) -> None:
    login = tmp_path / "login"
    (login / ".ssh").mkdir(parents=True)
    real = tmp_path / "keys-elsewhere"
    real.write_bytes(b"a 1 x\nb 2 orch-allocation:s-1\nc 3 y")
    real.chmod(0o640)
    (login / ".ssh" / "authorized_keys").symlink_to(real)
    assert remove_key_lines(str(login), "orch-allocation:s-1") == 1
    assert real.read_bytes() == b"a 1 x\nc 3 y" and real.stat().st_mode & 0o777 == 0o640
    assert (login / ".ssh" / "authorized_keys").is_symlink()
    assert remove_key_lines(str(login), "orch-allocation:s-1") == 0  # again: nothing to do
    assert sorted(os.listdir(tmp_path)) == ["keys-elsewhere", "login"]  # no temporary left
    assert remove_key_lines(str(tmp_path / "nobody"), "orch-allocation:s-1") == 0


def test_the_command_runs_the_program_from_slash_with_every_value_quoted() -> None:
    text = allocation_end_command("/h/orch-jobs/.node/o n.pyz", "/h/.orch-fleet/s-1 $x", "m;1")
    words = shlex.split(text.strip("()"))
    assert words == [
        "cd", "/", "&&", "python3", "-u", "/h/orch-jobs/.node/o n.pyz", "allocation-end",
        "--home", "/h/.orch-fleet/s-1 $x", "--marker", "m;1",
    ]  # fmt: skip
    assert '"$HOME"/' in allocation_end_command("orch-jobs/.node/x.pyz", HOME, MARKER)


def test_the_program_is_in_the_node_runtime() -> None:
    assert runtime_main.PROGRAMS["allocation-end"] == "allocation_end"
    assert "allocation_end.py" in runtime.sources()
    assert "allocation-end" in runtime.program_command("allocation-end", "--home", HOME)
    assert allocation_end.MARKER_PREFIX + "s-0123456789ab" == MARKER
