"""`orch submit` reads `run` and `setup` against the workdir as the sync sends it (the real
rsync with the sync's own filters): the tutorial's `run: python train.py` beside multinode.py is
a warning naming multinode.py, in the dry run's words and its JSON, and an error (exit 2,
nothing launched) with --strict. Through the console entry point, in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import assert_nothing_provisioned
from tests.support.in_process import isolated_home, run_main

WARNING = "run: python train.py: train.py is not in the workdir; did you mean multinode.py?"


@pytest.fixture
def tutorial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The multi-node DDP tutorial's folder with the spec `orch init` wrote: its run names
    train.py, the folder holds multinode.py (and a script that .gitignore leaves out)."""
    isolated_home(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "multinode.py").write_text("print('training')\n")
    (tmp_path / "scratch.py").write_text("print('a local trial')\n")
    (tmp_path / ".gitignore").write_text("scratch.py\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: tutorial\nworkdir: .\nrun: python train.py --epochs 5\n"
        "resources: {nodes: 2, gpus_per_node: 1}\n"
    )
    return spec


def test_a_misnamed_script_is_named_with_a_suggestion(tutorial: Path) -> None:
    code, out, err = run_main(["submit", str(tutorial), "--dry-run"])
    assert code == 0, out + err
    assert f"warning: {WARNING}" in err.splitlines(), err
    assert out.startswith("would launch 2 x local-1x"), out

    code, out, err = run_main(["submit", str(tutorial), "--dry-run", "--json"])
    assert code == 0, out + err
    (warning,) = json.loads(out)["script_warnings"]
    assert warning["message"] == WARNING and warning["suggestions"] == ["multinode.py"]


def test_strict_refuses_it_before_anything_is_launched(tutorial: Path) -> None:
    code, out, err = run_main(["submit", str(tutorial), "--strict", "--yes"])
    assert code == 2, out + err
    assert f"error: {WARNING}" in err and "without --strict" in err, err
    assert_nothing_provisioned(tutorial.parent / "orch")


def test_an_ignored_script_is_told_and_a_found_one_is_not(tutorial: Path) -> None:
    tutorial.write_text(tutorial.read_text().replace("train.py", "scratch.py"))
    code, out, err = run_main(["submit", str(tutorial), "--dry-run", "--json"])
    assert code == 0, out + err
    (warning,) = json.loads(out)["script_warnings"]
    assert warning["ignored"] and "left out of the sync by .gitignore" in warning["message"]

    tutorial.write_text(tutorial.read_text().replace("scratch.py", "multinode.py"))
    code, out, err = run_main(["submit", str(tutorial), "--dry-run", "--strict", "--json"])
    assert code == 0, out + err
    assert json.loads(out)["script_warnings"] == [] and "warning" not in err
