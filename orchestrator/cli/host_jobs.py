"""The controller host's rows of the jobs submitted from here, for `orch status` and `orch
cost` (`orchestrator.host.listing` merges them). Light at import: a list view without a host
reads one small file more and imports nothing else."""

from __future__ import annotations

import json
from typing import Any


def host_rows(command: str) -> tuple[list[dict[str, Any]], list[str], str] | None:
    """The host's `orch COMMAND --json` document's jobs, the ids submitted from here and the
    host's address, for `orch status` and `orch cost` to list the jobs that live there; None
    without a host or such jobs. A host that does not answer is said on stderr (its jobs are
    then missing from the list, never silently)."""
    from orchestrator.cli.context import orch_home
    from orchestrator.host.record import load

    record = load(orch_home())  # one small file: a command without a host pays no more
    if record is None or not record.jobs:
        return None
    from orchestrator.cli.context import load_settings
    from orchestrator.cli.output import make_console
    from orchestrator.errors import OrchError
    from orchestrator.host.remote_jobs import ask

    settings = load_settings()
    where = f"{record.user}@{record.host}"
    try:
        result = ask(settings, [command, "--json"], timeout=60)
        jobs = json.loads(result.stdout)["jobs"] if result.ok else None
    except (OrchError, ValueError, KeyError) as exc:
        result, jobs = None, None
        why = str(exc)
    else:
        why = (result.stderr.strip().splitlines() or ["no answer"])[-1]
    if jobs is None:
        make_console(stderr=True).print(
            f"[orch] the controller host {where} did not answer ({why}): its "
            f"{len(record.jobs)} job(s) are not listed",
            highlight=False,
            markup=False,
        )
        return None
    return jobs, record.jobs, where
