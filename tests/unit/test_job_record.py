"""The job record a detached controller reads: env values apart, in a file only the owner reads."""

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
from orchestrator.spec.model import ENV_HIDDEN, LoadedJob

SPEC = """\
name: rec
workdir: .
run: python train.py
env: {API_TOKEN: "s3cr3t-value 'q' $x", LEVEL: 3}
"""


def _loaded(tmp_path: Path) -> LoadedJob:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return load_job(path)


def test_env_values_live_only_in_the_private_file(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = _loaded(tmp_path)
    ledger = Ledger(make_engine(settings.db_path))
    register_job(settings, ledger, loaded, "local", "rec-1")

    directory = settings.job_dir("rec-1")
    record = json.loads((directory / JOB_RECORD).read_text())
    assert record["spec"]["env"] == {"API_TOKEN": ENV_HIDDEN, "LEVEL": ENV_HIDDEN}
    secrets = directory / JOB_SECRETS
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert json.loads(secrets.read_text()) == {
        "env": {"API_TOKEN": "s3cr3t-value 'q' $x", "LEVEL": "3"}
    }
    with Session(ledger.engine) as session:
        (job,) = session.exec(select(Job))
    assert "s3cr3t" not in job.spec_json
    assert json.loads(job.spec_json)["env"] == {"API_TOKEN": ENV_HIDDEN, "LEVEL": ENV_HIDDEN}

    again = load_job_record(settings, "rec-1")
    assert again.spec == loaded.spec  # the controller gets the values back
    assert again.workdir == loaded.workdir


def test_a_record_written_before_env_json_still_loads(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch")
    loaded = _loaded(tmp_path)
    save_job_record(settings, "rec-2", loaded)
    directory = settings.job_dir("rec-2")
    record = json.loads((directory / JOB_RECORD).read_text())
    record["spec"]["env"] = dict(loaded.spec.env)  # how older versions wrote it
    (directory / JOB_RECORD).write_text(json.dumps(record))
    (directory / JOB_SECRETS).unlink()
    assert load_job_record(settings, "rec-2").spec == loaded.spec
