"""`orch init [--template script|demo] [PATH]`: write a starter job.yaml, commented field by
field, for the user's own `train.py` (or orch's demo trainer). What goes where is
`orchestrator.spec.starter`; this module renders its result. Registered on the app by
`orchestrator.cli.app`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.output import make_console
from orchestrator.spec.starter import TemplateName, write_starter

__all__ = ["init_command"]


def init_command(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="file to write (a directory gets job.yaml inside); default ./job.yaml",
            show_default=False,
        ),
    ] = None,
    template: Annotated[
        TemplateName,
        typer.Option(
            "--template",
            "-t",
            help="script: your own `python train.py` under torchrun; "
            "demo: orch's reference trainer on synthetic data",
        ),
    ] = "script",
    force: Annotated[
        bool, typer.Option("--force", "-f", help="overwrite the file if it exists")
    ] = False,
) -> None:
    """Write a starter job spec (job.yaml) that `orch submit` runs as it is; exit 2 if the file
    exists (without --force)."""
    starter = write_starter(path, template, force=force)
    console = make_console()
    verb = "replaced" if starter.replaced else "wrote"
    console.print(
        f"{verb} {starter.path} ({starter.template} template, job name {starter.name})",
        highlight=False,
        markup=False,
    )
    if starter.setup is None:
        console.print(
            "no requirements.txt beside it: its setup line is commented out", highlight=False
        )
    try:
        shown = starter.path.relative_to(Path.cwd())
    except ValueError:
        shown = starter.path
    console.print(
        f"next: read the comments, then orch submit {shown} --dry-run",
        highlight=False,
        markup=False,
    )
