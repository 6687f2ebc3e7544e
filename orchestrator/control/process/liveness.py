"""Whether a job has lost its controller, read from the job's directory alone: no
configuration, no ledger, stdlib only, so that the check every command makes first
(`supervision.revive_controllers`, and `orch status`'s quick form of it) costs nothing.

`ORCH_HOME/jobs/<id>/controller.lock` is held (flock) by the process that drives the job for as
long as it runs (`supervision.ControllerLock`); a lock cannot outlive its process, so a free
lock means no controller. `job.json` beside it is the job's record, written by the submit;
a job without one has nothing a new controller could drive.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "controller.lock"
JOB_RECORD = "job.json"
JOB_SECRETS = "env.json"  # the spec's secrets' values beside the record: the one copy, 0600


def lock_held(job_dir: Path) -> bool:
    """Whether some process holds the controller lock in `job_dir` right now."""
    path = job_dir / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we may have taken
    return False


def controller_lost(job_dir: Path) -> bool:
    """Whether the (unfinished) job of `job_dir` needs a new controller: none holds its lock,
    and its record was written."""
    return not lock_held(job_dir) and (job_dir / JOB_RECORD).exists()
