"""How `orch submit` shows the workdir's files that a run may take for a checkpoint
(`control.verbs.stale_files`): a warning naming each with its size and age, on stderr, so that a
submit's stdout (the plan, the job id, a JSON document) stays what it was."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from orchestrator.cli.output import make_console

if TYPE_CHECKING:
    from orchestrator.control.verbs.stale_files import StaleCheckpoints


def print_stale(stale: StaleCheckpoints | None) -> None:
    """The warning (or, with --fresh, what was left out), one file a line, then the hint."""
    if stale is None:
        return
    console = make_console(stderr=True)
    style = "dim" if stale.fresh else "yellow"
    console.print(stale.headline(), style=style, markup=False, highlight=False)
    for line in stale.lines(datetime.now(UTC)):
        console.print(f"  {line}", markup=False, highlight=False)
    if stale.hint:
        console.print(f"  -> {stale.hint}", markup=False, highlight=False)
