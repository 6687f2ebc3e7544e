"""Bad input is refused with exit 2 and a clear message, before anything is provisioned."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tests.support.helpers import orch_env, processes_with_marker, run_orch

GOOD = "name: ok\nworkdir: work\nrun: python train.py\nresources: {nodes: 1, gpus_per_node: 1}\n"

CASES = {
    "yaml syntax": ("name: ok\nworkdir: work\nrun: [unclosed\n", [], ["line 3"]),
    "unknown field": (GOOD + "resources2: 1\n", [], ["resources2", "line 5"]),
    "nodes 0": (GOOD, ["--nodes", "0"], ["--nodes", ">= 1"]),
    "gpus -1": (GOOD, ["--gpus", "-1"], ["--gpus"]),
    "missing workdir": ("name: ok\nrun: python train.py\n", [], ["workdir"]),
    "workdir not there": (GOOD.replace("work\n", "nowhere\n"), [], ["workdir", "line 2"]),
    "empty run": ("name: ok\nworkdir: work\nrun: '  '\n", [], ["run", "line 3"]),
    "unknown provider": (GOOD, ["--provider", "mars"], ["--provider", "mars", "local, aws"]),
    "unknown provider in the spec": (GOOD + "provider: mars\n", [], ["provider (line 5)"]),
    "wrong type": (GOOD.replace("nodes: 1", "nodes: [1]"), [], ["resources.nodes (line 4)"]),
    "bad flag value": (GOOD, ["--nodes", "two"], ["--nodes"]),
    "conflicting flags": (GOOD, ["--dry-run", "--detach"], ["--dry-run or --detach"]),
    "huge file": (GOOD + "#" * (1 << 20) + "\n", [], ["1 MiB"]),
    "deep nesting": (GOOD + "x: " + "[" * 5000 + "]" * 5000 + "\n", [], ["nested"]),
    "bad tag": (GOOD + "setup: !!int abc\n", [], ["line 5", "not a valid int"]),
    "deadline passed": (
        GOOD + "deadline: 2026-01-01T09:30:00+02:00\n",
        [],
        ["deadline 2026-01-01T07:30:00Z has already passed", "deadline: 36h"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exit_2_nothing_provisioned(tmp_path: Path, case: str) -> None:
    body, flags, expected = CASES[case]
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(body)
    home = tmp_path / "orch"
    result = run_orch(["submit", str(spec), *flags], orch_env(home), timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    for fragment in expected:
        assert fragment in output, output
    assert not (home / "local" / "nodes").exists() or not any((home / "local/nodes").iterdir())
    assert processes_with_marker(str(home)) == []
    if (home / "orch.db").exists():
        with sqlite3.connect(home / "orch.db") as db:
            assert db.execute("select count(*) from lease").fetchone() == (0,)


@pytest.mark.parametrize("kind", ["named pipe", "directory", "not utf-8"])
def test_unreadable_spec_files_exit_2(tmp_path: Path, kind: str) -> None:
    spec = tmp_path / "job.yaml"
    if kind == "named pipe":
        os.mkfifo(spec)  # no writer: reading it would wait forever
    elif kind == "directory":
        spec.mkdir()
    else:
        spec.write_bytes(GOOD.encode() + b"setup: \xff\xfe\n")
    result = run_orch(["submit", str(spec)], orch_env(tmp_path / "orch"), timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    expected = {
        "named pipe": "is not a regular file (a named pipe)",
        "directory": "is a directory",
        "not utf-8": "is not UTF-8 text (line 5)",
    }[kind]
    assert expected in " ".join(output.split()), output
