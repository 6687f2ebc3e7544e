"""`orch check [PROVIDER...]`: what each provider needs on this machine, and how to get it."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from orchestrator.cli.context import load_settings
from orchestrator.cli.output import make_console

if TYPE_CHECKING:
    from orchestrator.providers.check import Readiness


def check_document(results: list[Readiness]) -> dict:
    """`orch check --json`: `ready` (every provider checked is) and each provider's parts."""
    return {
        "ready": all(result.ready for result in results),
        "providers": [
            {
                "provider": result.provider,
                "ready": result.ready,
                "requirements": [dataclasses.asdict(item) for item in result.requirements],
            }
            for result in results
        ],
    }


def render(results: list[Readiness]) -> list[str]:
    """The human report (rich markup): one block per provider, one line per part (`note`: a
    part the provider does without), and the fix under each part that is not there."""
    lines: list[str] = []
    for result in results:
        verdict = "[green]ready[/]" if result.ready else "[red]not ready[/]"
        lines.append(f"[bold]{result.provider}[/]: {verdict}")
        for item in result.requirements:
            if item.ok:
                mark = "[green]ok[/]     "
            else:
                mark = "[red]missing[/]" if item.needed else "[yellow]note[/]   "
            lines.append(f"  {mark} {escape(item.name)}: {escape(item.detail)}")
            if not item.ok and item.fix:
                lines.append(f"           -> {escape(item.fix)}")
    return lines


def check_command(
    providers: Annotated[
        list[str] | None,
        typer.Argument(help="providers to check (local, aws); every one when omitted"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Report what each provider needs on this machine (local: sshd, rsync, ssh, and root with
    ip for namespace nodes, whose traffic must get through the host's firewall; aws: rsync,
    ssh, credentials that STS accepts, enabled regions) and how to fix what is missing. Exits 0
    when every needed part is there, 1 otherwise."""
    from orchestrator.providers.check import check
    from orchestrator.spec.model import PROVIDER_NAMES

    settings = load_settings()
    names = list(dict.fromkeys(providers or PROVIDER_NAMES))
    results = [check(name, settings) for name in names]
    if json_out:
        sys.stdout.write(json.dumps(check_document(results), indent=2) + "\n")
    else:
        console = make_console()
        for line in render(results):
            console.print(line, highlight=False)
    raise typer.Exit(0 if all(result.ready for result in results) else 1)
