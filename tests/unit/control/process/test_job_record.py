"""The job record a detached controller reads: secrets' values apart, in a file only the owner
reads; env values are settings and stay in the record and the ledger."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

from sqlmodel import Session, select

from orchestrator.config import Settings
from orchestrator.control.process.controllers import (
    JOB_RECORD,
    JOB_SECRETS,
    load_job_record,
    register_job,
    save_job_record,
)
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.spec.loading import load_job
from orchestrator.spec.model import SECRET_HIDDEN, LoadedJob

SPEC = """\
name: rec
workdir: .
run: python train.py
env: {LEVEL: 3, PRICE: "5$$"}
secrets: {API_TOKEN: "s3cr3t-value 'q' $$x", FROM_SHELL: null}
"""
SHELL = {"FROM_SHELL": "sh3ll-$HOME-value"}


def _loaded(tmp_path: Path) -> LoadedJob:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return load_job(path, environ=SHELL)


def test_secret_values_live_only_in_the_private_file(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = _loaded(tmp_path)
    ledger = Ledger(make_engine(settings.db_path))
    register_job(settings, ledger, loaded, "local", "rec-1")

    directory = settings.job_dir("rec-1")
    record = json.loads((directory / JOB_RECORD).read_text())
    hidden = {"API_TOKEN": SECRET_HIDDEN, "FROM_SHELL": SECRET_HIDDEN}
    assert record["spec"]["secrets"] == hidden
    assert record["spec"]["env"] == {"LEVEL": "3", "PRICE": "5$"}
    secrets = directory / JOB_SECRETS
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert json.loads(secrets.read_text()) == {
        "secrets": {"API_TOKEN": "s3cr3t-value 'q' $x", "FROM_SHELL": "sh3ll-$HOME-value"}
    }
    with Session(ledger.engine) as session:
        (job,) = session.exec(select(Job))
    assert "s3cr3t" not in job.spec_json and "sh3ll" not in job.spec_json
    stored = json.loads(job.spec_json)
    assert stored["secrets"] == hidden
    assert stored["env"] == {"LEVEL": "3", "PRICE": "5$"}
    assert "s3cr3t" not in (directory / JOB_RECORD).read_text()

    again = load_job_record(settings, "rec-1")
    assert again.spec == loaded.spec  # the controller gets the values back, expanded once
    assert again.workdir == loaded.workdir


def test_the_record_loads_back_whole(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = dataclasses.replace(
        _loaded(tmp_path), data_sources=[tmp_path / "data"], left_out=("a.pt", "ckpt/b.pt")
    )
    save_job_record(settings, "rec-2", loaded)
    assert load_job_record(settings, "rec-2") == loaded


def test_a_bucket_source_is_kept_as_null_and_loads_back_as_none(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = dataclasses.replace(_loaded(tmp_path), data_sources=[tmp_path / "data", None])
    save_job_record(settings, "rec-4", loaded)
    record = json.loads((settings.job_dir("rec-4") / JOB_RECORD).read_text())
    assert record["data_sources"] == [str(tmp_path / "data"), None]
    assert load_job_record(settings, "rec-4").data_sources == [tmp_path / "data", None]


def test_the_secrets_values_are_read_from_env_json_alone(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    save_job_record(settings, "rec-3", _loaded(tmp_path))
    directory = settings.job_dir("rec-3")
    record = json.loads((directory / JOB_RECORD).read_text())
    record["spec"]["secrets"] = {"API_TOKEN": "from-job-json", "FROM_SHELL": "from-job-json"}
    (directory / JOB_RECORD).write_text(json.dumps(record))
    (directory / JOB_SECRETS).write_text(json.dumps({"secrets": {"API_TOKEN": "from-env-json"}}))
    assert load_job_record(settings, "rec-3").spec.secrets == {"API_TOKEN": "from-env-json"}
