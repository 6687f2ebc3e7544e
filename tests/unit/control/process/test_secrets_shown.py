"""Where a job's environment shows: `env` values in dry runs, `orch status` and the ledger's
spec; `secrets` only by name, their values nowhere but the job's private file. Through the
console entry point, in this process."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.control.process.controllers import JOB_SECRETS, register_job
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.spec.loading import assignment_overrides, load_job
from tests.support.in_process import run_main

SECRET = "hf-planted-4b1d"
FILE_SECRET = "wb-planted-77aa"
SPEC = """\
name: shown
workdir: work
run: python train.py
env: {OMP_NUM_THREADS: 2, RUN_NAME: "${USER_TAG}-run"}
secrets: {WANDB_API_KEY: null}
"""


@pytest.fixture
def job_file(tmp_path: Path, orch_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("ORCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ORCH_HOME", str(orch_home))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("USER_TAG", "ada")
    monkeypatch.setenv("WANDB_API_KEY", FILE_SECRET)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    (tmp_path / "work").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return path


def _no_secret(text: str) -> None:
    assert SECRET not in text and FILE_SECRET not in text


def test_a_dry_run_shows_env_values_and_hides_secrets(job_file: Path) -> None:
    flags = ["--env", "LEVEL=3", "--secret", "HF_TOKEN"]
    code, out, err = run_main(["submit", str(job_file), "--dry-run", "--json", *flags])
    assert code == 0, out + err
    spec = json.loads(out)["spec"]
    assert spec["env"] == {"OMP_NUM_THREADS": "2", "RUN_NAME": "ada-run", "LEVEL": "3"}
    assert spec["secrets"] == {"WANDB_API_KEY": "(hidden)", "HF_TOKEN": "(hidden)"}
    _no_secret(out + err)

    code, out, err = run_main(["submit", str(job_file), "--dry-run", *flags])
    assert code == 0, out + err
    assert "env OMP_NUM_THREADS=2" in out and "env RUN_NAME=ada-run" in out, out
    assert "secret HF_TOKEN (value hidden)" in out, out
    _no_secret(out + err)


def test_a_secret_flag_naming_an_unset_variable_exits_2(
    job_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN")
    code, out, err = run_main(["submit", str(job_file), "--dry-run", "--secret", "HF_TOKEN"])
    assert code == 2, out + err
    assert "HF_TOKEN is not set in this shell" in out + err, out + err


def test_status_and_the_ledger_show_env_values_and_secret_names_only(
    job_file: Path, orch_home: Path
) -> None:
    overrides = assignment_overrides("--secret", "secrets", ["HF_TOKEN"], os.environ)
    loaded = load_job(job_file, overrides)
    settings = load_settings()
    ledger = Ledger(make_engine(settings.db_path))
    register_job(settings, ledger, loaded, "local", "shown-1")
    ledger.update_job("shown-1", state="SUCCEEDED")  # nothing to drive: no controller revived

    code, out, err = run_main(["status", "shown-1", "--json"])
    assert code == 0, out + err
    document = json.loads(out)
    assert document["env"] == {"OMP_NUM_THREADS": "2", "RUN_NAME": "ada-run"}
    assert document["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"]
    _no_secret(out + err)
    code, out, err = run_main(["status", "shown-1"])
    assert code == 0, out + err
    assert "OMP_NUM_THREADS=2, RUN_NAME=ada-run" in out, out
    assert "HF_TOKEN, WANDB_API_KEY (values hidden)" in out, out
    _no_secret(out + err)

    with sqlite3.connect(orch_home / "orch.db") as db:
        (spec_json,) = db.execute("select spec_json from job").fetchone()
    assert json.loads(spec_json)["env"]["RUN_NAME"] == "ada-run"
    _no_secret(spec_json)
    for path in orch_home.rglob("*"):  # the ledger, its WAL, the job record: all but one file
        if path.is_file() and path.name != JOB_SECRETS:
            _no_secret(path.read_text(errors="replace"))
    assert SECRET in (settings.job_dir("shown-1") / JOB_SECRETS).read_text()
