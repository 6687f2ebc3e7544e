"""Who drives a job: one controller process per job, found by a lock, revived when it died.

Each job has `ORCH_HOME/jobs/<id>/controller.lock`, held (flock) by the process that drives
the job, a foreground `orch submit` or a detached controller, for as long as it runs; its pid
is in `controller.pid` beside it. A lock cannot outlive its process, so "is the controller
alive?" never trusts a stale pid. A job that is not final and whose lock is free has lost its
controller: `revive_controllers` starts a detached one, which adopts the job.

On a shared ledger the lock keeps out this machine's processes only: a controller also holds
the job's lease in the ledger (`lease_keeper`), and which jobs this machine may revive, and
which are another machine's, is `adoption.plan_adoption`'s call.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.config import Settings
from orchestrator.control.process.adoption import Adoption, plan_adoption
from orchestrator.control.process.liveness import JOB_RECORD as JOB_RECORD
from orchestrator.control.process.liveness import JOB_SECRETS as JOB_SECRETS
from orchestrator.control.process.liveness import LOCK_FILE, lock_held
from orchestrator.control.process.machine_id import holder_id, machine_id
from orchestrator.errors import OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.sharing import names_only
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.spec.model import JobSpec, LoadedJob


def try_lock(path: Path) -> int | None:
    """Take an exclusive lock on file `path` (made 0600, with its folder) without waiting:
    the open descriptor, held until closed; None when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class ControllerLock:
    """The exclusive right to drive one job. Acquire before acting; held until released."""

    def __init__(self, settings: Settings, job_id: str) -> None:
        self.directory = settings.job_dir(job_id)
        self.path = self.directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another process holds it."""
        fd = try_lock(self.path)
        if fd is None:
            return False
        self._fd = fd
        pid_file = self.directory / "controller.pid"
        write_atomic(pid_file, f"{os.getpid()}\n")
        return True

    def release(self) -> None:
        if self._fd is not None:
            (self.directory / "controller.pid").unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def controller_running(settings: Settings, job_id: str) -> bool:
    """Whether some process holds the job's controller lock right now."""
    return lock_held(settings.job_dir(job_id))


def controller_pid(settings: Settings, job_id: str) -> int | None:
    try:
        return int((settings.job_dir(job_id) / "controller.pid").read_text())
    except (OSError, ValueError):
        return None


def spawn_controller(settings: Settings, job_id: str) -> subprocess.Popen[bytes]:
    """Start a detached controller for the job: own session, no terminal, output to a log.

    It outlives the command that started it. If another controller already holds the job's
    lock, the new one exits at once, so a spawn is always safe.
    """
    log_path = settings.job_dir(job_id) / "controller.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ORCH_HOME=str(settings.home))
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator.control.daemon", job_id],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=env,
            close_fds=True,
        )


def wait_for_controller(
    settings: Settings, job_id: str, process: subprocess.Popen[bytes], timeout: float = 30.0
) -> None:
    """Return once the spawned controller holds the job's lock; raise if it died first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if controller_running(settings, job_id):
            return
        if process.poll() is not None:
            log = settings.job_dir(job_id) / "controller.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise OrchError(f"the controller of {job_id} exited at start:\n{tail}")
        time.sleep(0.05)
    raise OrchError(f"the controller of {job_id} did not start within {timeout:.0f} s")


def revive(settings: Settings, ledger: Ledger, job_ids: Iterable[str] | None = None) -> Adoption:
    """Start a controller for every unfinished job that needs one from this ORCH_HOME (only
    among `job_ids` when given; `adoption.plan_adoption` says which); the plan says what was
    revived and, on a shared ledger, which jobs are another machine's. A job whose record
    was never written is left alone."""
    jobs = ledger.jobs() if job_ids is None else ledger.jobs_of(job_ids)  # one read
    adoption = plan_adoption(settings, ledger, jobs)
    for job_id in adoption.revive:
        spawn_controller(settings, job_id)
    return adoption


def revive_controllers(
    settings: Settings, ledger: Ledger, job_ids: Iterable[str] | None = None
) -> list[str]:
    """`revive`, returning the ids of the jobs given a new controller."""
    return revive(settings, ledger, job_ids).revive


def refused_by_last_controller(ledger: Ledger, job_id: str) -> str | None:
    """Why the job's last controller would not drive it (the REFUSED event's message: another
    cloud identity than its nodes'), when that is the job's newest event; None otherwise. A
    controller revived from the same environment refuses it again and touches nothing."""
    last = ledger.events(job_id)[-1:]
    return last[0].message if last and last[0].kind == "REFUSED" else None


# --- what a controller needs to drive a job without the original command line -------------


def save_job_record(settings: Settings, job_id: str, loaded: LoadedJob) -> None:
    """Keep the loaded spec (flags applied, paths resolved) for detached and adopting runs.

    job.json shows only the names of the spec's `secrets`; their values go to env.json beside
    it, readable by the owner only (written 0600 from the start).
    """
    directory = settings.job_dir(job_id)
    directory.mkdir(parents=True, exist_ok=True)
    write_private_json(directory / JOB_SECRETS, {"secrets": dict(loaded.spec.secrets)})
    record = {
        "spec": loaded.spec.public_document(),
        "source": str(loaded.source),
        "base_dir": str(loaded.base_dir),
        "workdir": str(loaded.workdir),
        "data_sources": [None if p is None else str(p) for p in loaded.data_sources],
        "left_out": list(loaded.left_out),
    }
    path = directory / JOB_RECORD
    write_atomic(path, json.dumps(record, indent=2))


def write_private_json(path: Path, document: object) -> None:
    """Write `document` to `path` atomically; the file is never readable by others."""
    write_atomic(path, json.dumps(document), private=True)


def load_job_record(settings: Settings, job_id: str) -> LoadedJob:
    """The job as `save_job_record` kept it (job.json and env.json), secrets' values included."""
    directory = settings.job_dir(job_id)
    record = json.loads((directory / JOB_RECORD).read_text())
    spec = record["spec"]
    spec["secrets"] = json.loads((directory / JOB_SECRETS).read_text())["secrets"]
    return LoadedJob(
        spec=JobSpec.model_validate(spec),
        source=Path(record["source"]),
        base_dir=Path(record["base_dir"]),
        workdir=Path(record["workdir"]),
        data_sources=[None if p is None else Path(p) for p in record["data_sources"]],
        left_out=tuple(record["left_out"]),
    )


# --- registering a job ----------------------------------------------------------------------


def controller_identity(holder: str | None = None) -> str:
    """Who drives a job, recorded in the ledger for people reading it: the holder of its
    controller lease (machine:pid) on a shared ledger, else host:pid."""
    return holder or f"{os.uname().nodename}:{os.getpid()}"


def new_job_id(name: str) -> str:
    return f"{name}-{os.urandom(3).hex()}"


def register_job(
    settings: Settings,
    ledger: Ledger,
    loaded: LoadedJob,
    provider_name: str,
    job_id: str,
    *,
    cluster_id: str | None = None,
) -> Job:
    """Write the job record and the ledger row (state PENDING) before anything is provisioned;
    `cluster_id`: the kept cluster it runs on. A shared ledger gets the names of the spec's
    `env` but not their values (`ledger.sharing`), and the machine that submitted the job."""
    spec = loaded.spec
    shared = settings.ledger.shared
    save_job_record(settings, job_id, loaded)
    document = spec.public_document()
    if shared:
        document["env"] = names_only(document["env"])
    return ledger.add_job(
        Job(
            id=job_id,
            name=spec.name,
            state=JobState.PENDING,
            provider=provider_name,
            nodes=spec.resources.nodes,
            gpus_per_node=spec.resources.gpus_per_node,
            spec_json=json.dumps(document),
            spec_path=str(loaded.source),
            created_at=utcnow(),
            controller=controller_identity(
                holder_id(machine_id(settings.home)) if shared else None
            ),
            cluster_id=cluster_id,
            owner=settings.owner_label,
        )
    )
