"""`orch submit` refuses bad input with exit 2 and a message that names the problem, before
anything is provisioned: every case through the console entry point, in this process
(`tests/e2e/test_bad_input.py` shows the same in a real `orch` process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.helpers import assert_nothing_provisioned
from tests.support.in_process import run_main

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
    "bad duration flag": (GOOD, ["--idle-timeout", "10x"], ["--idle-timeout", "invalid duration"]),
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


@pytest.fixture
def orch_home_set(orch_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ORCH_HOME of this test in this process's environment, and no other ORCH_* variable."""
    for name in [n for n in os.environ if n.startswith("ORCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ORCH_HOME", str(orch_home))
    monkeypatch.setenv("COLUMNS", "160")
    return orch_home


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exit_2_nothing_provisioned(
    tmp_path: Path, orch_home_set: Path, case: str
) -> None:
    body, flags, expected = CASES[case]
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(body)
    code, out, err = run_main(["submit", str(spec), *flags])
    output = out + err
    assert code == 2, output
    assert "Traceback" not in output
    for fragment in expected:
        assert fragment in output, output
    assert_nothing_provisioned(orch_home_set)


@pytest.mark.parametrize("kind", ["directory", "not utf-8"])
def test_unreadable_spec_files_exit_2(tmp_path: Path, orch_home_set: Path, kind: str) -> None:
    spec = tmp_path / "job.yaml"
    if kind == "directory":
        spec.mkdir()
    else:
        spec.write_bytes(GOOD.encode() + b"setup: \xff\xfe\n")
    code, out, err = run_main(["submit", str(spec)])
    output = out + err
    assert code == 2, output
    assert "Traceback" not in output
    expected = {"directory": "is a directory", "not utf-8": "is not UTF-8 text (line 5)"}[kind]
    assert expected in " ".join(output.split()), output
    assert_nothing_provisioned(orch_home_set)


@pytest.mark.parametrize(("flag", "seconds"), [("600", 600.0), ("10m", 600.0), ("1h30m", 5400.0)])
def test_duration_flags_take_what_the_spec_takes(
    tmp_path: Path, orch_home_set: Path, flag: str, seconds: float
) -> None:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(GOOD)
    code, out, err = run_main(["submit", str(spec), "--dry-run", "--json", "--idle-timeout", flag])
    assert code == 0, out + err
    assert json.loads(out)["spec"]["budget"]["idle_timeout"] == seconds


@pytest.mark.parametrize(
    "argv",
    [
        ["local", "preempt", "some-job", "--notice", "2x"],
        ["status", "--watch", "--interval", "-5s"],
    ],
)
def test_every_duration_flag_refuses_what_the_spec_refuses(
    orch_home_set: Path, argv: list[str]
) -> None:
    code, out, err = run_main(argv)
    assert code == 2, out + err
    assert "Invalid value for '--" in out + err
