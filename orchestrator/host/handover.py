"""Hand-over kits: what this ORCH_HOME keeps of each job it submitted to the controller host, so
that a new host can drive the job when the old one is gone.

A kit is what driving a job takes besides its ledger rows (`control.adoption.can_drive_here`):
the job's record and secrets file (`jobs/<id>/job.json`, `env.json`) and its nodes' SSH key
(`keys/<id>/id_ed25519` and `.pub`). `fetch` copies them from the host right after the job is
submitted there, into `ORCH_HOME/controller-host/kits/<id>/` (0700 folders, 0600 files, the same
care the host gives them); `push` puts them into a new host's ORCH_HOME. Both move the files as
a tar stream over SSH's stdout and stdin, never through any command line.

The ledger rows are not in the kit: a new host sees them only when the ledger outlives the host
(`ledger.url`, the team database). Then the job's controller lease decides who drives it: once
the dead host's lease has expired, the new host's orch adopts the job on its existing nodes.
"""

from __future__ import annotations

import base64
import io
import os
import shlex
import shutil
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator.errors import ControllerHostError
from orchestrator.host.record import host_dir
from orchestrator.host.session import HostSession

# The names `control.liveness` gives a job's record and secrets file, and `remote.keys` its key.
JOB_RECORD, JOB_SECRETS = "job.json", "env.json"
KEY_FILES = ("id_ed25519", "id_ed25519.pub")
KEYS_WAIT_S = 30.0  # how long `fetch` waits for the host's controller to make the job's key


def kit_dir(home: Path, job_id: str) -> Path:
    """Where this ORCH_HOME keeps the kit of `job_id`."""
    return host_dir(home) / "kits" / job_id


def kit_files(job_id: str) -> list[str]:
    """The kit's files, relative to an ORCH_HOME (the host's, and the kit folder alike)."""
    return [
        *(f"jobs/{job_id}/{name}" for name in (JOB_RECORD, JOB_SECRETS)),
        *(f"keys/{job_id}/{name}" for name in KEY_FILES),
    ]


def complete(home: Path, job_id: str) -> bool:
    """Whether this ORCH_HOME holds every file of the job's kit."""
    return all((kit_dir(home, job_id) / name).is_file() for name in kit_files(job_id))


def fetch(session: HostSession, home: Path, job_id: str, *, wait_s: float = KEYS_WAIT_S) -> bool:
    """Copy the kit of `job_id` from the host into this ORCH_HOME; returns whether it is
    complete. The job's key is made by its controller just before it launches nodes, so this
    waits up to `wait_s` for it; a kit without it is kept all the same (a job that never
    launched a node needs no key)."""
    host_home = session.layout.home
    key = shlex.quote(f"{host_home}/keys/{job_id}/{KEY_FILES[0]}")
    deadline = time.monotonic() + wait_s
    while not session.run(f"test -s {key}", check=False).ok and time.monotonic() < deadline:
        time.sleep(0.5)
    names = " ".join(shlex.quote(n) for n in kit_files(job_id))
    packed = session.run(
        f"cd {shlex.quote(host_home)} && for f in {names}; do [ -f $f ] && echo $f; done "
        "| tar czf - -T - | base64 -w0"
    ).stdout
    _unpack(packed, kit_dir(home, job_id))
    return complete(home, job_id)


def push(session: HostSession, home: Path, job_ids: Iterable[str]) -> list[str]:
    """Put the kits of `job_ids` into the host's ORCH_HOME; returns the ids it had kits of."""
    buffer = io.BytesIO()
    sent = []
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for job_id in job_ids:
            folder = kit_dir(home, job_id)
            present = [n for n in kit_files(job_id) if (folder / n).is_file()]
            if not present:
                continue
            for name in present:
                tar.add(folder / name, arcname=name)
            sent.append(job_id)
    if sent:
        session.run(
            f"umask 077 && mkdir -p {shlex.quote(session.layout.home)} && "
            f"base64 -d | tar xzf - -C {shlex.quote(session.layout.home)}",
            stdin=base64.b64encode(buffer.getvalue()).decode() + "\n",
        )
    return sent


def kept_jobs(home: Path) -> list[str]:
    """Ids of the jobs this ORCH_HOME keeps a kit of."""
    folder = host_dir(home) / "kits"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def forget_all(home: Path) -> None:
    """Remove every kit (the host, and its jobs with it, are forgotten: `orch controller down`)."""
    shutil.rmtree(host_dir(home) / "kits", ignore_errors=True)


def _unpack(packed: str, folder: Path) -> None:
    try:
        data = base64.b64decode(packed.strip())
    except ValueError as exc:
        raise ControllerHostError(f"the host sent an unreadable hand-over kit: {exc}") from exc
    old = os.umask(0o077)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(folder, filter="data")
    finally:
        os.umask(old)
    for path in folder.rglob("*"):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
