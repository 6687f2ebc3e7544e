"""Hand-over kits: what this ORCH_HOME keeps of each job it submitted to the controller host, so
that a new host can drive the job when the old one is gone.

A kit is what driving a job takes besides its ledger rows
(`control.process.adoption.can_drive_here`):
the job's record and secrets file (`jobs/<id>/job.json`, `env.json`) and its nodes' SSH key
(`keys/<id>/id_ed25519` and `.pub`). `fetch` copies them from the host right after the job is
submitted there, into `ORCH_HOME/controller-host/kits/<id>/` (0700 folders, 0600 files, the same
care the host gives them); `push` puts them into a new host's ORCH_HOME. Both move the files as
a tar stream over SSH's stdout and stdin, never through any command line. What the host sends
is data: the job id must have the job-id shape (`kit_dir`), and only the kit's named files are
taken from its tar, bounded, as regular files (`kit_archive`).

Each `orch status JOB` asked of the host also keeps, in the kit, what the host's ledger said of
the job (`carried.json`: its first start, recoveries and every lease, `control.repair.carried`), so
that a rebuilt job keeps its limits; `push` sends it with the kit.

Beside the kit, this ORCH_HOME keeps the job's submission (`submission.json`, never sent): where
its workdir and data sources are here and which folder of the host holds their copy, so that a
new host gets them again (`resend`) and the record points to its own copy (`move_record`).

The ledger rows are not in the kit. With a ledger that outlives the host (`ledger.url`, the team
database) the job's controller lease decides who drives it: once the dead host's lease has
expired, the new host's orch adopts the job on its existing nodes. Without one, the new host
rebuilds the job's rows from the kit and the job's running nodes (`control.repair.rebuild`).
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import shutil
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.host import kit_archive
from orchestrator.host.record import checked_job_id, host_dir
from orchestrator.host.session import HostSession
from orchestrator.host.submission import moved_record
from orchestrator.spec.ids import is_job_id

# The names `control.process.liveness` gives a job's record and secrets file, and `remote.keys` its
# key.
JOB_RECORD, JOB_SECRETS = "job.json", "env.json"
CARRIED = "carried.json"  # the figures kept of the job for a rebuild (`control.repair.carried`)
KEY_FILES = ("id_ed25519", "id_ed25519.pub")
KEYS_WAIT_S = 30.0  # how long `fetch` waits for the host's controller to make the job's key
SUBMISSION = "submission.json"


@dataclass(frozen=True)
class Submission:
    """Where a remote job's files are: here (absolute paths) and on the host (`folder`)."""

    folder: str  # the host's submission folder: work/ and data/<i> in it
    workdir: str  # the workdir on this machine
    # the data sources on this machine, in the spec's order; None for a bucket (not sent)
    data: list[str | None]


def kit_dir(home: Path, job_id: str) -> Path:
    """Where this ORCH_HOME keeps the kit of `job_id`; raises `ControllerHostError` for an id
    that is not of the job-id shape (`record.checked_job_id`), so no id names another folder."""
    return host_dir(home) / "kits" / checked_job_id(job_id, "the name of a hand-over kit")


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
    folder = kit_dir(home, job_id)  # checks the id before it reaches any command or path
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
    kit_archive.unpack(packed, folder, kit_files(job_id))
    return complete(home, job_id)


def carried_file(job_id: str) -> str:
    """Where the kit keeps the job's figures (`save_carried`), relative to it."""
    return f"jobs/{job_id}/{CARRIED}"


def save_carried(home: Path, job_id: str, document: str) -> None:
    """Keep the figures of `job_id` (`control.repair.carried`: checked before they get here) in its
    kit (0600), replacing those kept before; `push` sends them with it."""
    kit_archive.write_private(kit_dir(home, job_id), {carried_file(job_id): document.encode()})


def push(session: HostSession, home: Path, job_ids: Iterable[str]) -> list[str]:
    """Put the kits of `job_ids` (with the figures kept of each) into the host's ORCH_HOME;
    returns the ids it had kits of."""
    buffer = io.BytesIO()
    sent = []
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for job_id in job_ids:
            folder = kit_dir(home, job_id)
            names = [*kit_files(job_id), carried_file(job_id)]
            present = [n for n in names if (folder / n).is_file()]
            if not present:
                continue
            for name in present:
                tar.add(folder / name, arcname=name)
            sent.append(job_id)
    if sent:
        session.run(
            f"umask 077 && mkdir -p {shlex.quote(session.layout.home)} && "
            f"base64 -d | tar xzf - --no-same-owner -C {shlex.quote(session.layout.home)}",
            stdin=base64.b64encode(buffer.getvalue()).decode() + "\n",
        )
    return sent


def save_submission(home: Path, job_id: str, submission: Submission) -> None:
    """Keep where the job's files are (see `Submission`) beside its kit (0600)."""
    document = json.dumps(asdict(submission)).encode()
    kit_archive.write_private(kit_dir(home, job_id), {SUBMISSION: document})


def load_submission(home: Path, job_id: str) -> Submission | None:
    """The job's `Submission`; None when this ORCH_HOME kept none (or it is unreadable)."""
    try:
        document = json.loads((kit_dir(home, job_id) / SUBMISSION).read_text())
        data = [None if p is None else str(p) for p in document["data"]]
        return Submission(str(document["folder"]), str(document["workdir"]), data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resend(
    session: HostSession, home: Path, job_id: str, say: Callable[[str], None] = lambda _: None
) -> str | None:
    """Send the job's workdir and local data sources from this machine to the host of `session`
    (under a submission folder of its own, named as on the old host) and point the kit's
    record there; a replacement node syncs them from that copy. Returns why it could not
    (no submission kept, or a source gone from this machine), None once done. `say` gets a
    line before each transfer."""
    submission = load_submission(home, job_id)
    if submission is None:
        return "this ORCH_HOME kept no record of where its workdir is"
    sources = [Path(submission.workdir), *(Path(p) for p in submission.data if p is not None)]
    gone = [str(p) for p in sources if not p.exists()]
    if gone:
        return f"its files are gone from this machine: {', '.join(gone)}"
    folder = session.layout.submission(Path(submission.folder).name)
    say(f"job {job_id}: sending its workdir {submission.workdir} to the new host")
    session.push(Path(submission.workdir), f"{folder}/work", workdir=True)
    for i, source in enumerate(submission.data):
        if source is None:  # a bucket: the nodes download it themselves
            continue
        say(f"job {job_id}: sending its data {source} to the new host")
        session.push(Path(source), f"{folder}/data/{i}")
    move_record(home, job_id, folder)
    return None


def move_record(home: Path, job_id: str, folder: str) -> None:
    """Point the kit's record (and the kept submission) at the host's submission `folder`."""
    submission = load_submission(home, job_id)
    if submission is None or submission.folder == folder:
        return
    path = kit_dir(home, job_id) / f"jobs/{job_id}/{JOB_RECORD}"
    if path.is_file():
        record = moved_record(json.loads(path.read_text()), submission.folder, folder)
        written = path.stat()  # its time is the job's submit time to a rebuilding host
        times = (written.st_atime_ns, written.st_mtime_ns)
        write_atomic(path, json.dumps(record, indent=2), private=True, times_ns=times)
    save_submission(home, job_id, Submission(folder, submission.workdir, submission.data))


def kept_jobs(home: Path) -> list[str]:
    """Ids of the jobs this ORCH_HOME keeps a kit of (folders of the job-id shape only)."""
    folder = host_dir(home) / "kits"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if is_job_id(p.name) and p.is_dir())


def forget_all(home: Path) -> None:
    """Remove every kit (the host, and its jobs with it, are forgotten: `orch controller down`)."""
    shutil.rmtree(host_dir(home) / "kits", ignore_errors=True)
