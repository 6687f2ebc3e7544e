"""What this ORCH_HOME knows of its controller host: ORCH_HOME/controller-host/host.json.

Written atomically (a reader sees the old or the new file, never half of one) and versioned.
No file: no controller host, and every command works on this machine as before.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.errors import ControllerHostError
from orchestrator.spec.ids import is_job_id

VERSION = 1


@dataclass(frozen=True)
class HostRecord:
    """The controller host of one ORCH_HOME."""

    kind: str  # "adopted" (`--host`: left running by `down`) or "launched" (ended by `down`)
    user: str  # SSH login user
    host: str  # address orch connects to
    port: int  # sshd port
    host_key: str  # the pinned host key ("ssh-ed25519 AAAA...")
    identity: str  # private key file orch logs in with
    root: str  # absolute path of orch's folder on the host (see layout.HostLayout)
    autostop_s: float  # idle seconds before the host stops itself (0: never)
    version: str  # orch version installed there
    installed_at: str  # UTC ISO time `up` finished
    instance_id: str | None = None  # the launched node (None: adopted)
    provider: str | None = None  # the provider that launched it (None: adopted)
    price_per_hour: str | None = None  # USD per hour of a launched host (None: adopted)
    launched_at: str | None = None  # UTC ISO time its billing started (None: adopted)
    jobs: list[str] = field(default_factory=list)  # ids of the jobs submitted to the host


def host_dir(home: Path) -> Path:
    return home / "controller-host"


def _path(home: Path) -> Path:
    return host_dir(home) / "host.json"


def load(home: Path) -> HostRecord | None:
    """The recorded host, or None when this ORCH_HOME has none."""
    try:
        document = json.loads(_path(home).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ControllerHostError(
            f"cannot read {_path(home)}: {exc}",
            hint="fix or remove the file (`orch controller down` forgets the host)",
        ) from exc
    document.pop("format", None)
    return HostRecord(**document)


def require(home: Path) -> HostRecord:
    """The recorded host; raises when there is none."""
    record = load(home)
    if record is None:
        raise ControllerHostError(
            "this ORCH_HOME has no controller host",
            hint="`orch controller up --host user@addr` or `orch controller up --provider local`",
        )
    return record


def save(home: Path, record: HostRecord) -> None:
    path = _path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path, json.dumps({"format": VERSION, **dataclasses.asdict(record)}, indent=2) + "\n"
    )


def checked_job_id(text: object, where: str) -> str:
    """`text`, a job id the host gave (`where`: in what), once it has the job-id shape
    (`spec.ids`); anything else raises: a host's answer never names a path here."""
    if not is_job_id(text):
        shown = repr(text)[:80]
        raise ControllerHostError(
            f"the controller host gave {shown} as a job id in {where}: not a job id, ignored",
            hint="the host's orch may be broken or the host compromised: "
            "`orch controller logs` shows its daemon's log",
        )
    return str(text)


def add_job(home: Path, job_id: str) -> None:
    """Remember that `job_id` (checked: `checked_job_id`) lives on the host (its ledger is
    there, not here)."""
    job_id = checked_job_id(job_id, "its answer to orch submit")
    record = require(home)
    if job_id not in record.jobs:
        save(home, dataclasses.replace(record, jobs=[*record.jobs, job_id]))


def forget(home: Path) -> None:
    _path(home).unlink(missing_ok=True)
