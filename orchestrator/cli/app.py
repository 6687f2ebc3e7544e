"""The `orch` command line: one function per verb; every read command has --json.

Exit codes: 0 success, 1 job failed, 2 bad input, 3 provider/capacity error, 4 budget cap,
5 stalled, 130 cancelled. Library code raises `OrchError`s; only `main` turns them into exit codes.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from orchestrator.cli.cleanup import down_command, reconcile_command
from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import JsonFlag
from orchestrator.cli.job_commands import cancel_command, report_command, wait_command
from orchestrator.cli.list_views import cost_command, status_command
from orchestrator.cli.logs import logs_command
from orchestrator.cli.output import make_console, print_json
from orchestrator.cli.simulate import simulate_command
from orchestrator.cli.submit import submit_command
from orchestrator.errors import OrchError, SpecError

app = typer.Typer(
    name="orch",
    help="Run distributed PyTorch training on cheap cloud nodes, and shut them down after.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


app.command(name="submit")(submit_command)


app.command(name="status")(status_command)


app.command(name="logs")(logs_command)


app.command(name="wait")(wait_command)


app.command(name="cancel")(cancel_command)


app.command(name="cost")(cost_command)


app.command(name="report")(report_command)


app.command(name="down")(down_command)


@app.command()
def catalog(
    gpu: Annotated[str | None, typer.Option("--gpu", help="only this GPU, e.g. A10G")] = None,
    json_out: JsonFlag = False,
) -> None:
    """AWS GPU instance types with their GPUs and on-demand prices per region."""
    from rich.table import Table

    from orchestrator.providers.aws.catalog import catalog_document, catalog_rows, load_catalog

    data = load_catalog()
    if json_out:
        print_json(catalog_document(data, gpu=gpu))
        return
    rows = catalog_rows(data, gpu=gpu)
    if not rows:
        raise SpecError(
            f"no instance type with GPU {gpu!r}",
            hint=f"GPUs in the catalog: {', '.join(data.accelerators())}",
        )
    regions = sorted({region for row in rows for region in row["on_demand_usd_per_hour"]})
    table = Table(title=f"AWS GPU instance types, on-demand $/h (catalog {data.date})")
    for column in ("type", "GPU", "GPUs", "GiB/GPU", "vCPU", "RAM GiB", *regions):
        table.add_column(column, justify="left" if column in ("type", "GPU") else "right")
    for row in rows:
        table.add_row(
            row["instance_type"], row["gpu"], str(row["gpus"]), f"{row['gpu_memory_gib']:g}",
            str(row["vcpus"]), f"{row['memory_gib']:g}",
            *(row["on_demand_usd_per_hour"].get(region, "-") for region in regions),
        )  # fmt: skip
    make_console().print(table)


app.command(name="simulate")(simulate_command)


app.command(name="reconcile")(reconcile_command)


def _add_sub_apps() -> None:
    from orchestrator.cli.check import check_command
    from orchestrator.cli.controller_host import app as controller_host_app
    from orchestrator.cli.dashboard import dashboard_command
    from orchestrator.cli.fleet import app as fleet_app
    from orchestrator.cli.init import init_command
    from orchestrator.cli.local import app as local_app
    from orchestrator.cli.sandbox import sandbox_app
    from orchestrator.cli.shell import ssh_command, ssh_config_command

    app.add_typer(local_app, name="local")
    app.add_typer(sandbox_app, name="sandbox")
    app.add_typer(controller_host_app, name="controller")
    app.add_typer(fleet_app, name="fleet")
    app.command(name="ssh")(ssh_command)
    app.command(name="ssh-config")(ssh_config_command)
    app.command(name="init")(init_command)
    app.command(name="check")(check_command)
    app.command(name="dashboard")(dashboard_command)


_add_sub_apps()


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        sys.stdout.write(f"orch {version('orch')}\n")
        raise typer.Exit()


@app.callback()
def _revive_lost_controllers(
    context: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Before any command: an unfinished job whose controller died gets a new one."""
    if context.invoked_subcommand in ("reconcile", "down", "sandbox"):
        return  # reconcile revives and reports it; down ends nodes, whatever drives them
    if "--help" in sys.argv[1:]:
        return  # a command's help runs nothing; click runs this before the command parses it
    from orchestrator.cli.context import check_settings, no_controller_lost, unfinished_job_ids

    check_settings()  # every command stops on invalid settings, before it does anything
    if no_controller_lost():
        return  # found through the ledger's read-only view, without SQLModel or the settings
    from orchestrator.cli.console import revived_line
    from orchestrator.control.process.controllers import refused_by_last_controller, revive

    settings = load_settings()
    if settings.ledger.url or settings.db_path.exists():
        ledger = open_ledger(settings)
        adoption = revive(settings, ledger, unfinished_job_ids(ledger))
        lines = [revived_line(job_id, refused_by_last_controller(ledger, job_id))
                 for job_id in adoption.revive] + [s.line() for s in adoption.stranded]  # fmt: skip
        for line in lines:
            make_console(stderr=True).print(line, highlight=False, markup=False)


def command() -> None:
    """Run the app as a click command whose help reads as paragraphs (`help_text.tidy`)."""
    import typer.main

    from orchestrator.cli.help_text import tidy

    tidy(typer.main.get_command(app))()


def main() -> None:
    """Console-script entry: run the app and turn OrchErrors into messages and exit codes."""
    try:
        command()  # argv goes to typer as it is; each job command routes once parsed (`on_host`)
    except OrchError as exc:
        make_console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        make_console(stderr=True).print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
