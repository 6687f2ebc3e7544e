"""`orch fleet ...`: machines the user already has, reached over SSH, as a named fleet."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import JsonFlag
from orchestrator.cli.output import make_console, print_json
from orchestrator.errors import SpecError

if TYPE_CHECKING:  # imported when a command runs: building the app (`orch --help`) needs none
    from orchestrator.control.verbs.fleets import FleetView, Probe

app = typer.Typer(
    name="fleet",
    help="Machines you already have (on-prem, reserved, started by hand), reached over SSH "
    "with your key, as a named fleet that jobs run on (provider: ssh).",
    no_args_is_help=True,
)


@app.command()
def add(
    name: Annotated[
        str | None, typer.Argument(help="the fleet's name (or `name:` in --file)")
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option("--host", help="a machine as USER@ADDR[:PORT]; repeat for each machine"),
    ] = None,
    identity: Annotated[
        Path | None, typer.Option("--identity", help="your private key that logs in to them")
    ] = None,
    known_hosts: Annotated[
        Path | None,
        typer.Option("--known-hosts", help="pin each host key from this known_hosts file"),
    ] = None,
    proxy_jump: Annotated[
        str | None,
        typer.Option("--proxy-jump", help="reach every machine through USER@ADDR[:PORT]"),
    ] = None,
    price_per_hour: Annotated[
        str | None, typer.Option("--price-per-hour", help="USD per host-hour (default 0)")
    ] = None,
    price_per_gpu_hour: Annotated[
        str | None, typer.Option("--price-per-gpu-hour", help="USD per GPU-hour instead")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="a YAML file with the same fields")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Add a fleet: connect to every machine at once and record what each has.

    orch logs in with your key, pins each machine's host key (the one it shows now, or the
    one --known-hosts lists) and records its GPUs (nvidia-smi), CPUs, memory, free disk, and
    Python and torch when present. The fleet is recorded only if every machine answered;
    otherwise each failed machine is named with its reason and nothing is recorded (exit 3).
    """
    from orchestrator.control.verbs.fleets import add_fleet, fleet_status
    from orchestrator.spec.fleet_file import fleet_from_flags, load_fleet_file

    flags = {
        "hosts": host or None, "identity": identity, "known_hosts": known_hosts,
        "proxy_jump": proxy_jump, "price_per_hour": price_per_hour,
        "price_per_gpu_hour": price_per_gpu_hour,
    }  # fmt: skip
    if file is not None:
        given = [k for k, v in flags.items() if v is not None]
        if given:
            raise SpecError(
                f"--file gives the whole fleet; leave out {', '.join(_flag(k) for k in given)}",
                hint="put those fields in the file",
            )
        request = load_fleet_file(file.expanduser().absolute(), name)
    else:
        if name is None:
            raise SpecError("name the fleet: orch fleet add NAME --host ... --identity KEY")
        request = fleet_from_flags({"name": name, **flags}, Path.cwd())
    settings = load_settings()
    ledger = open_ledger(settings)
    progress = make_console(stderr=True)
    add_fleet(
        ledger,
        request,
        owner=settings.owner_label,
        now=datetime.now(UTC),
        announce=lambda count: progress.print(
            f"probing {count} machine(s) of fleet {request.name}", highlight=False, markup=False
        ),
        progress=lambda answer: progress.print(_probe_line(answer), highlight=False, markup=False),
    )
    (view,) = fleet_status(ledger, request.name, datetime.now(UTC))
    if json_out:
        from orchestrator.control.verbs.fleets import fleet_document

        print_json(fleet_document(view))
        return
    _show(view)


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="one fleet (default: every fleet)")] = None,
    json_out: JsonFlag = False,
) -> None:
    """The fleets: each host's GPUs, free and held slots (and which job holds them), health,
    the queue of jobs waiting, and the use over the last 7 days (held vs idle host-hours)."""
    from orchestrator.control.verbs.fleets import fleet_document, fleet_status

    views = fleet_status(open_ledger(load_settings()), name, datetime.now(UTC))
    if json_out:
        documents = [fleet_document(view) for view in views]
        print_json(documents[0] if name is not None else {"fleets": documents})
        return
    if not views:
        make_console().print("no fleet; add one: orch fleet add NAME --host ... --identity KEY")
    for view in views:
        _show(view)


@app.command()
def remove(name: Annotated[str, typer.Argument(help="the fleet to forget")]) -> None:
    """Forget a fleet. Refused while a job holds or waits for its machines; the machines
    themselves are not touched."""
    from orchestrator.control.verbs.fleets import remove_fleet

    remove_fleet(open_ledger(load_settings()), name)
    make_console().print(f"fleet {escape(name)} removed", highlight=False)


def _flag(field: str) -> str:
    return "--host" if field == "hosts" else "--" + field.replace("_", "-")


def _probe_line(answer: Probe) -> str:
    if answer.error is not None or answer.facts is None:
        return f"  {answer.login}: failed: {answer.error}"
    facts = answer.facts
    gpus = (
        f"{len(facts.gpus)} x {facts.gpus[0].name} ({facts.gpus[0].memory_mib} MiB)"
        if facts.gpus
        else "no GPU"
    )
    torch = f", torch {facts.torch}" if facts.torch else ""
    return (
        f"  {answer.login}: {gpus}, {facts.cpus} CPUs, {facts.memory_mib // 1024} GiB, "
        f"{facts.disk_free_gb:g} GB free, python {facts.python or 'none'}{torch}"
    )


def _show(view: FleetView) -> None:
    from rich.table import Table

    from orchestrator.control.verbs.fleets import USAGE_DAYS, fleet_document

    document = fleet_document(view)
    console = make_console()
    unit = "host" if document["price_unit"] == "host" else "GPU"
    table = Table(
        title=f"fleet {escape(view.fleet.name)} (${document['price_per_hour']}/{unit}-hour)",
        title_justify="left",
    )
    for column in ("host", "GPUs", "CPUs", "mem GiB", "free", "held by", "health"):
        table.add_column(column)
    for host in document["hosts"]:
        names = sorted({f"{g['name']} {g['memory_mib'] // 1024} GiB" for g in host["gpus"]})
        gpus = f"{len(host['gpus'])} x {', '.join(names)}" if host["gpus"] else "none (CPU)"
        held = ", ".join(f"{h['slot']}:{h['job']}" for h in host["held"]) or "-"
        health = "ok" if host["healthy"] else f"unhealthy: {host['health_note']}"
        free = f"{len(host['free'])}/{len(host['slots'])}"
        row = (host["login"], gpus, str(host["cpus"]), str(host["memory_mib"] // 1024), free,
               held, health)  # fmt: skip
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    for waiter in document["queue"]:
        console.print(
            f"  queue {waiter['position']}: {waiter['job']} ({waiter['nodes']} node(s) x "
            f"{waiter['slots_per_node']}, {waiter['owner']}, since {waiter['since'][:19]}Z)",
            highlight=False,
            markup=False,
        )
    usage = document["usage"]
    console.print(
        f"  last {USAGE_DAYS} days: {usage['held_hours']:.1f} of {usage['host_hours']:.1f} "
        f"host-hours held, {usage['idle_hours']:.1f} idle ({usage['utilization']:.0%} used)",
        highlight=False,
    )
