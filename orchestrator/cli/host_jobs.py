"""The controller host's rows of the jobs submitted from here, for `orch status` and `orch
cost` (`orchestrator.host.listing` merges them). Light at import: a list view without a host
reads one small file more and imports nothing else."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.control.verbs.jobs import View

from orchestrator.atomic import write_atomic


def host_rows(view: View) -> tuple[list[dict[str, Any]], list[str], str] | None:
    """The host's `orch VIEW --json` document's jobs (`HostJobs.list`), the ids submitted from
    here and the host's address, for `orch status` and `orch cost` to list the jobs that live
    there; None without a host or such jobs.

    The host's last answer is kept (`controller-host/listing-VIEW.json`). When it shows
    every such job finished, it is the answer, and the host is not asked: a host that powered
    itself off after its last job costs no SSH timeout. A host that does not answer is said
    on stderr, and its last answer is shown, with its time; without one its jobs are missing
    from the list, never silently."""
    from orchestrator.cli.context import orch_home
    from orchestrator.host.record import host_dir, load

    home = orch_home()
    record = load(home)  # one small file: a command without a host pays no more
    if record is None or not record.jobs:
        return None
    from orchestrator.host.listing import all_final

    where = f"{record.user}@{record.host}"
    kept_path = host_dir(home) / f"listing-{view}.json"
    kept = _kept(kept_path)
    if kept is not None and all_final(kept["jobs"], record.jobs):
        return kept["jobs"], record.jobs, where
    from orchestrator.cli.context import load_settings
    from orchestrator.cli.output import make_console
    from orchestrator.control.verbs.host_jobs import HostJobs
    from orchestrator.errors import OrchError

    try:
        jobs: list[dict[str, Any]] | None = HostJobs(load_settings()).list(view)["jobs"]
    except OrchError as exc:
        jobs = None
        why = (str(exc).strip().splitlines() or ["no answer"])[-1]
    if jobs is not None:
        wanted = set(record.jobs)
        _keep(kept_path, [row for row in jobs if row.get("id") in wanted])
        return jobs, record.jobs, where
    said = f"[orch] the controller host {where} did not answer ({why}): "
    if kept is not None:
        said += f"its {len(record.jobs)} job(s) as it listed them at {kept['at']}"
    else:
        said += f"its {len(record.jobs)} job(s) are not listed"
    make_console(stderr=True).print(said, highlight=False, markup=False)
    return None if kept is None else (kept["jobs"], record.jobs, where)


def _kept(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
        return {"at": str(document["at"]), "jobs": list(document["jobs"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _keep(path: Path, jobs: list[dict[str, Any]]) -> None:
    """Keep the host's answer (written whole or not at all)."""
    document = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "jobs": jobs}
    with contextlib.suppress(OSError):
        write_atomic(path, json.dumps(document))
