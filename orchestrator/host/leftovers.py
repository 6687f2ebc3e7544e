"""What the host removes once a job of its own ended, so that no secret's value and no copy of
the user's files outlives the job there:

- the job's secrets file (`home/jobs/<id>/env.json`, 0600: the one file on the host that holds
  a secret's value, written by the host's orch at submit);
- its submission folder (`submissions/<token>/`: the workdir and data `orch submit --remote`
  sent, which the job's nodes sync from while it runs).

A submission folder that no unfinished job points to (a laptop that died between sending the
files and submitting) is removed once it is `ORPHAN_AGE_S` old. The daemon runs both after
each look at the jobs that worked. Only paths computed here, under the host's root, are
removed: a record that points elsewhere is left alone.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from orchestrator.host.layout import HostLayout
from orchestrator.spec.ids import is_job_id

ORPHAN_AGE_S = 3600.0  # a submission no job took is removed once this old
SECRETS_FILE = "env.json"  # control.process.liveness.JOB_SECRETS (the host wing may not import it)
RECORD_FILE = "job.json"  # control.process.liveness.JOB_RECORD
TOKEN_RE = re.compile(r"[0-9a-f]{12}")  # `remote_jobs.submit`'s folder names


def submission_of(layout: HostLayout, job_id: str) -> Path | None:
    """The submission folder of the job's record (its `base_dir`), when that is one of this
    host's (`submissions/<token>`); None otherwise (no record, or a job submitted there)."""
    try:
        record = json.loads((Path(layout.home) / "jobs" / job_id / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    base = record.get("base_dir") if isinstance(record, dict) else None
    if not isinstance(base, str):
        return None
    path = Path(base)
    if path.parent != Path(layout.submissions) or not TOKEN_RE.fullmatch(path.name):
        return None
    return path


def clear_ended(layout: HostLayout, job_ids: Iterable[str]) -> list[str]:
    """Remove the secrets file and the submission folder of each of `job_ids` (jobs of this
    host that ended); returns the paths removed."""
    removed: list[str] = []
    for job_id in job_ids:
        if not is_job_id(job_id):
            continue
        secrets = Path(layout.home) / "jobs" / job_id / SECRETS_FILE
        if secrets.is_file() and not secrets.is_symlink():
            secrets.unlink(missing_ok=True)
            removed.append(str(secrets))
        folder = submission_of(layout, job_id)
        if folder is not None and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def clear_orphans(layout: HostLayout, running: Iterable[str], now: float) -> list[str]:
    """Remove the submission folders at least `ORPHAN_AGE_S` old (by their time, epoch
    seconds against `now`) that none of `running` (this host's unfinished jobs) points to;
    returns the paths removed."""
    try:
        entries = [p for p in Path(layout.submissions).iterdir() if TOKEN_RE.fullmatch(p.name)]
    except OSError:
        return []
    old = [p for p in entries if p.is_dir() and not p.is_symlink()
           and now - p.lstat().st_mtime >= ORPHAN_AGE_S]  # fmt: skip
    if not old:
        return []
    taken = {submission_of(layout, job_id) for job_id in running if is_job_id(job_id)}
    removed = []
    for path in old:
        if path not in taken:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed
