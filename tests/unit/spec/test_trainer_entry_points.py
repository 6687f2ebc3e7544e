"""The reference trainer has two names: `orch_trainer`, the one orch runs, and `trainer`, an
equal entry point to the same modules that warns of nothing. Neither hides a project's own
`trainer` package in a job's workdir, nor is hidden by it where orch runs its trainer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.spec.loading import load_job
from orchestrator.spec.starter import write_starter

REPO = Path(__file__).resolve().parents[3]
SHORT_NAME = re.compile(r"-m trainer\.|\bfrom trainer\b|\bimport trainer\b|\"trainer\.train\"")
ORCH_USAGE = "usage: python -m orch_trainer.train"


def _python(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`python -W error ARGS` in `cwd`, orch's packages on the path after it (as installed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-W", "error", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_python_m_trainer_train_runs_orch_trainer_and_warns_nothing(tmp_path: Path) -> None:
    result = _python("-m", "trainer.train", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(ORCH_USAGE), result.stdout
    assert result.stderr == ""


def test_the_entry_point_keeps_the_trainers_exit_status(tmp_path: Path) -> None:
    result = _python("-m", "trainer.train", "--no-such-flag", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == "trainer: error: unrecognized arguments: --no-such-flag\n"


def test_a_module_of_trainer_is_orch_trainers_own_and_importing_it_warns_nothing(
    tmp_path: Path,
) -> None:
    code = (
        "import importlib, trainer.errors, trainer.args, orch_trainer.errors\n"
        "assert trainer.errors is orch_trainer.errors\n"
        "from trainer.errors import CheckpointError\n"
        "assert CheckpointError is orch_trainer.errors.CheckpointError\n"
        "assert importlib.import_module('trainer.args') is importlib.import_module("
        "'orch_trainer.args')\n"
    )
    result = _python("-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def _project(workdir: Path, *, regular: bool) -> Path:
    """A job's workdir with a `trainer` package of its own (`regular`: with an __init__.py,
    else a namespace folder) whose `train` and `main` modules say whose they are."""
    package = workdir / "trainer"
    package.mkdir(parents=True)
    if regular:
        (package / "__init__.py").write_text("")
    for module in ("train", "main"):
        (package / f"{module}.py").write_text(f"print('project {module}')\n")
    return workdir


@pytest.mark.parametrize("regular", [True, False], ids=["regular", "namespace"])
def test_a_workdirs_own_trainer_package_and_orchs_trainer_leave_each_other_alone(
    tmp_path: Path, regular: bool
) -> None:
    workdir = _project(tmp_path / "work", regular=regular)
    # orch's trainer, run in the workdir (as on a node) by the command `orch init` writes there
    starter = write_starter(workdir, "demo", force=False)
    python, *command = load_job(starter.path).spec.run.split()[:3]
    assert (python, command) == ("python", ["-m", "orch_trainer.train"])
    ours = _python(*command, "--help", cwd=workdir)
    assert ours.returncode == 0 and ours.stdout.startswith(ORCH_USAGE), ours.stderr
    assert ours.stderr == ""
    # and the project's own modules are its own, under both names it could run them by
    for module in ("train", "main"):
        theirs = _python("-m", f"trainer.{module}", cwd=workdir)
        assert (theirs.returncode, theirs.stdout, theirs.stderr) == (0, f"project {module}\n", "")


def test_every_module_of_orch_trainer_has_its_entry_in_trainer() -> None:
    ours = {p.name for p in (REPO / "orch_trainer").glob("*.py")}
    entries = {p.name for p in (REPO / "trainer").glob("*.py")}
    assert entries == ours - {"__init__.py"}
    assert not (REPO / "trainer" / "__init__.py").exists()  # a namespace: never hides another


def test_the_demo_template_runs_orch_trainer() -> None:
    spec = load_job(REPO / "templates" / "demo-ddp.yaml").spec
    assert spec.run.startswith("python -m orch_trainer.train "), spec.run


def test_orch_names_its_own_trainer_orch_trainer_only() -> None:
    """What orch runs or shows as its trainer says `orch_trainer`, which a project's `trainer`
    never shadows; `trainer` is documented as the equal entry point, never run by orch."""
    shipped = [
        REPO / "README.md",
        REPO / "Makefile",
        *REPO.glob("templates/*.yaml"),
        *REPO.glob("orchestrator/templates/*.yaml"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("bench/*.py"),
        *REPO.glob("tests/e2e/*.py"),
        *REPO.glob("orch_trainer/*.py"),
    ]
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in shipped
        for number, line in _outside_the_trainers_own_section(path.read_text())
        if SHORT_NAME.search(line)
    ]
    assert found == []


def _outside_the_trainers_own_section(text: str) -> list[tuple[int, str]]:
    """Numbered lines of a file but those of docs/spot.md's "The reference trainer" section,
    which documents both names."""
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            inside = line == "### The reference trainer"
        if not inside:
            lines.append((number, line))
    return lines
