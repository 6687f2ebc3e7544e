"""`write_file_command`, the one way orch writes a file on a node or the controller host: the
content travels on stdin, goes into a fresh temporary file of its own and replaces the file
whole, with its mode, or not at all. Run here by bash, as the other machine's login shell runs
it; the host's writes (`host/lifecycle.py`) go through it too."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.host import lifecycle
from orchestrator.node.file_write import PRIVATE, write_file_command

SECRET = "export TOKEN=hunter2\n"


def write(command: str, home: Path, content: str) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run(
        ["bash", "-c", command], input=content, env=env, capture_output=True, text=True,
        timeout=30, cwd=home,
    )  # fmt: skip


def test_the_content_is_never_in_the_command_and_each_write_has_a_temporary_of_its_own() -> None:
    command = write_file_command("/srv/orch/home/env", PRIVATE)
    assert "hunter2" not in command and "cat >" in command  # the content is stdin
    assert 'mktemp "$f.XXXXXXXX"' in command  # a unique name, never `env.tmp`
    assert "chmod 0600" in command and 'mv -f "$t" "$f"' in command
    assert command.startswith("f=/srv/orch/home/env;")  # an absolute path stays absolute
    assert write_file_command("orch-jobs/j/env").startswith('f="$HOME"/orch-jobs/j/env;')


def test_a_file_is_replaced_whole_with_its_mode_and_nothing_left_beside_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "host" / "daemon.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o644)
    done = write(write_file_command(str(target), PRIVATE), tmp_path, SECRET)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == SECRET
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(target.parent) == ["daemon.json"]


def test_a_write_that_fails_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_text("old")
    failed = write(write_file_command("config.json", "not-a-mode"), tmp_path, SECRET)
    assert failed.returncode != 0
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["config.json"]


class _Shell:
    """The host's session, as `lifecycle` uses it: a command and its stdin, run by bash."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def run(self, command: str, stdin: str | None = None) -> None:
        done = write(command, self.home, stdin or "")
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["env", "config.yaml"])
def test_the_host_s_files_are_written_past_a_link_planted_at_a_temporary_name(
    tmp_path: Path, name: str
) -> None:
    """A link another user left where a fixed temporary name would be (`env.tmp`) is not
    followed: the secret goes into the host's file alone, 0600."""
    root = tmp_path / "orch-host"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    (root / f"{name}.tmp").symlink_to(elsewhere)
    lifecycle._write(_Shell(tmp_path), str(root / name), SECRET)  # type: ignore[arg-type]
    assert elsewhere.read_text() == "untouched"
    assert (root / name).read_text() == SECRET
    assert stat.S_IMODE((root / name).stat().st_mode) == 0o600
