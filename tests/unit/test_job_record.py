"""The job record a detached controller reads: secrets' values apart, in a file only the owner
reads; env values are settings and stay in the record and the ledger."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from sqlmodel import Session, select

from orchestrator.config import Settings
from orchestrator.control.supervision import (
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


def _older_record(settings: Settings, job_id: str, loaded: LoadedJob, spec: dict) -> Path:
    """The job's record as an older version wrote it: `spec` merged into its spec."""
    save_job_record(settings, job_id, loaded)
    directory = settings.job_dir(job_id)
    record = json.loads((directory / JOB_RECORD).read_text())
    record["spec"] = {k: v for k, v in {**record["spec"], **spec}.items() if v is not None}
    (directory / JOB_RECORD).write_text(json.dumps(record))
    return directory


def test_a_record_written_before_secrets_existed_still_loads(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = _loaded(tmp_path)
    hidden_env = dict.fromkeys(loaded.spec.env, SECRET_HIDDEN)  # env.json held env's values
    directory = _older_record(settings, "rec-2", loaded, {"env": hidden_env, "secrets": None})
    (directory / JOB_SECRETS).write_text(json.dumps({"env": dict(loaded.spec.env)}))
    again = load_job_record(settings, "rec-2").spec
    assert again.env == loaded.spec.env and again.secrets == {}


def test_a_record_written_before_env_json_still_loads(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = _loaded(tmp_path)
    inline = {"secrets": dict(loaded.spec.secrets)}  # how the oldest versions wrote it
    (_older_record(settings, "rec-3", loaded, inline) / JOB_SECRETS).unlink()
    assert load_job_record(settings, "rec-3").spec == loaded.spec
