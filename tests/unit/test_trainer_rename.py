"""The reference trainer is `orch_trainer`; the old name `trainer` forwards to it for one release
with a DeprecationWarning, and nothing orch ships still uses the old name."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.spec.loading import load_job

REPO = Path(__file__).resolve().parents[2]
OLD_NAME = re.compile(r"-m trainer\.|\bfrom trainer\b|\bimport trainer\b|\"trainer\.train\"")


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_python_m_trainer_train_still_runs_and_warns() -> None:
    result = _python("-m", "trainer.train", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m orch_trainer.train"), result.stdout
    assert "DeprecationWarning" in result.stderr, result.stderr
    assert "python -m orch_trainer.train" in result.stderr, result.stderr


def test_the_old_entry_point_keeps_the_trainers_exit_status() -> None:
    result = _python("-m", "trainer.train", "--no-such-flag")
    assert result.returncode == 2, result.stderr
    assert "trainer: error: unrecognized arguments: --no-such-flag" in result.stderr


def test_importing_an_old_module_gives_the_new_one_and_warns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("trainer", "trainer.checkpoint", "trainer.errors"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.warns(DeprecationWarning, match="orch_trainer"):
        old = importlib.import_module("trainer.checkpoint")
    new = importlib.import_module("orch_trainer.checkpoint")
    assert old is new
    from trainer.errors import CheckpointError

    assert CheckpointError is importlib.import_module("orch_trainer.errors").CheckpointError


def test_every_module_of_orch_trainer_has_its_forwarder() -> None:
    new = {p.name for p in (REPO / "orch_trainer").glob("*.py")}
    old = {p.name for p in (REPO / "trainer").glob("*.py")}
    assert new == old


def test_the_demo_template_runs_orch_trainer() -> None:
    spec = load_job(REPO / "templates" / "demo-ddp.yaml").spec
    assert spec.run.startswith("python -m orch_trainer.train "), spec.run


def test_nothing_orch_ships_names_the_old_package() -> None:
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
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OLD_NAME.search(line)
    ]
    assert found == []
