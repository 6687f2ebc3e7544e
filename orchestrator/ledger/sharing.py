"""What a ledger other machines share holds of a job's spec: the names of its `env` variables
but not their values. The values stay in the submitting machine's job record
(`ORCH_HOME/jobs/<id>/job.json`), and the secrets' values in the 0600 file beside it.

`names_only` is the `env` a shared ledger stores (`Job.spec_json`); `shown_env` puts the values
back, on the machine that has the job's record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENV_NOT_SHARED = "(kept on the submitting machine)"  # an env value in a shared ledger
JOB_RECORD = "job.json"  # the job record in ORCH_HOME/jobs/<id>/ (`control.process.liveness`)


def names_only(env: dict[str, str]) -> dict[str, str]:
    """`env` as a shared ledger stores it: each value replaced by `ENV_NOT_SHARED`."""
    return dict.fromkeys(env, ENV_NOT_SHARED)


def shown_env(document: dict[str, Any], job_dir: Path) -> dict[str, str]:
    """The `env` to show of a job whose ledger document (`Job.spec_json`) is `document`: as
    the ledger has it, or, where the ledger holds only its names, with the values of the job
    record in `job_dir` when this machine has it (the names alone otherwise). Reads no file
    unless the ledger lacks values."""
    env = document.get("env") or {}
    if ENV_NOT_SHARED not in env.values():
        return env
    return record_env(job_dir / JOB_RECORD) or env


def record_env(record: Path) -> dict[str, str] | None:
    """The `env` of the job record at `record` (values included); None when this machine has
    no such record (the job was submitted elsewhere) or it cannot be read."""
    try:
        env = json.loads(record.read_text())["spec"]["env"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return env if isinstance(env, dict) else None
