"""Bad input is refused with exit 2 and a clear message, before anything is provisioned, by a
real `orch` process. Every refusal case runs in-process in tests/unit/cli/test_submit_refusals.py;
here only what a separate process shows: the exit status of the installed command, no
traceback on its stderr, no controller left running, and a spec that is a named pipe does not
block it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.helpers import assert_nothing_provisioned, orch_env, run_orch

GOOD = "name: ok\nworkdir: work\nrun: python train.py\nresources: {nodes: 1, gpus_per_node: 1}\n"


def test_an_unknown_field_exits_2_from_the_installed_command_and_provisions_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(GOOD + "resources2: 1\n")
    home = tmp_path / "orch"
    result = run_orch(["submit", str(spec), "--nodes", "2"], orch_env(home), timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert "resources2" in output and "line 5" in output, output
    assert_nothing_provisioned(home)


def test_a_named_pipe_as_spec_exits_2_without_waiting_for_a_writer(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    os.mkfifo(spec)  # no writer: reading it would wait forever
    result = run_orch(["submit", str(spec)], orch_env(tmp_path / "orch"), timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert "is not a regular file (a named pipe)" in " ".join(output.split()), output
