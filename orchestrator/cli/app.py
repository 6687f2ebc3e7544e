"""The `orch` command line: one function per verb; every read command has --json.

Exit codes: 0 success, 1 job failed, 2 bad input, 3 provider/capacity error, 4 budget cap,
5 stalled, 130 cancelled. Library code raises `OrchError`s; only `main` turns them into exit codes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.markup import escape

from orchestrator.cli.cleanup import down_command, reconcile_command
from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import DURATION_METAVAR, JsonFlag, duration
from orchestrator.cli.kept import kept_request
from orchestrator.cli.list_views import cost_command, status_command
from orchestrator.cli.logs import logs_command
from orchestrator.cli.output import make_console, print_json
from orchestrator.cli.simulate import simulate_command
from orchestrator.errors import OrchError, SpecError
from orchestrator.job_state import JobState

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.control.commands import PreparedSubmit
    from orchestrator.control.team_caps import SubmitBudget
    from orchestrator.ledger.store import Ledger
    from orchestrator.providers.plan import LaunchPlan
    from orchestrator.spec.model import CheckpointSpec, JobSpec, LoadedJob
    from orchestrator.spec.script_check import ScriptWarning

app = typer.Typer(
    name="orch",
    help="Run distributed PyTorch training on cheap cloud nodes, and shut them down after.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _kept_where(checkpoint: CheckpointSpec, mirror: Path) -> str:
    places = [] if checkpoint.mirror_mode == "none" else [f"{mirror} ({checkpoint.mirror_mode})"]
    if checkpoint.store:
        places.append(checkpoint.store)
    return " and ".join(places)


def _kept_phrase(ledger: Ledger, job_id: str) -> tuple[str, bool]:
    """What the job holds in words (`kept_phrase`: the newest checkpoints, each with its step
    and age), and whether it holds any."""
    from orchestrator.cluster.checkpoints.kept_summary import kept_phrase, newest_kept
    from orchestrator.ledger.measures import utcnow

    kept = newest_kept(ledger.checkpoints(job_id, live_only=True))
    return kept_phrase(kept, utcnow()), bool(kept)


def _confirm_spend(spec: JobSpec, plan: LaunchPlan) -> None:
    """Ask before a job without a budget bills a paid provider (`spend_guard`); without a
    terminal to ask on, refuse (SpecError, exit 2). Declined: exit 130, nothing launched."""
    from orchestrator.control.spend_guard import needs_confirmation

    notice = needs_confirmation(spec, plan)
    if notice is None:
        return
    if not sys.stdin.isatty():
        raise SpecError(
            f"{notice.text()}; not launched: there is no terminal to ask on",
            hint="pass --yes to launch anyway, or set a budget: --max-cost USD, "
            "budget.max_runtime in the spec, or controller.default_max_runtime "
            "(ORCH_DEFAULT_MAX_RUNTIME)",
        )
    if not typer.confirm(f"{notice.text()}. Launch?", default=False, err=True):
        make_console(stderr=True).print("not launched", highlight=False)
        raise typer.Exit(130)


def _team_view(settings: Settings, prepared: PreparedSubmit) -> SubmitBudget | None:
    """The monthly caps' view of a dry run's job (None without caps): their figures, and
    whether a submit would be refused."""
    if not settings.budget.capped:
        return None
    from orchestrator.control.team_caps import TeamCaps

    return TeamCaps(settings.budget, open_ledger(settings)).check_submit(
        prepared.loaded.spec.budget, prepared.plan, settings.owner_label
    )


def _print_environment(spec: JobSpec) -> None:
    """The run's own variables in a dry run: env values shown, secrets by name only."""
    console = make_console()
    for name, value in spec.env.items():
        console.print(f"  env {name}={value}", markup=False, highlight=False)
    for name in spec.secrets:
        console.print(f"  secret {name} (value hidden)", markup=False, highlight=False)


def _assignments(flag: str, what: str) -> typer.models.OptionInfo:
    """A repeatable `flag NAME[=VALUE]` option (`spec.loading.assignment_overrides` reads it)."""
    return typer.Option(
        flag, metavar="NAME[=VALUE]", help=f"set {what}; without =VALUE: this shell's $NAME"
    )


def _script_warnings(loaded: LoadedJob, *, strict: bool, shown: bool) -> list[ScriptWarning]:
    """The scripts and modules of run and setup the workdir does not hold
    (`control.script_check`): printed as warnings on stderr when `shown`, refused (SpecError,
    exit 2) with --strict."""
    from orchestrator.control import script_check

    found = script_check.script_warnings(loaded)
    if strict:
        script_check.refuse(found)
    console = make_console(stderr=True)
    for warning in found if shown else []:
        console.print(f"warning: {warning.message()}", markup=False, highlight=False)
    return found


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


@app.command()
def submit(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)", show_default=False)],
    nodes: Annotated[int | None, typer.Option("--nodes", help="number of nodes")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs (processes) per node")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="local or aws")] = None,
    spot: Annotated[bool | None, typer.Option("--spot/--no-spot", help="spot capacity")] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", help="hard cap on the job's spend, USD")
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(
            "--idle-timeout",
            parser=duration,
            metavar=DURATION_METAVAR,
            help="idleness before stopping (600, 10m, 1h)",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the plan, launch nothing")
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="hand the job to a background controller")
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="launch without asking, even on a paid provider with no budget"
        ),
    ] = False,
    env: Annotated[list[str] | None, _assignments("--env", "env.NAME")] = None,
    secret: Annotated[
        list[str] | None, _assignments("--secret", "secrets.NAME, never shown")
    ] = None,
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            metavar="CMD",
            help="run CMD (sh -c) when the job ends, its JSON on stdin; e.g. curl -d @- URL",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            "-c",
            metavar="NAME",
            help="run on kept cluster NAME (made when none is up) and keep its nodes after",
        ),
    ] = None,
    autostop: Annotated[
        str | None,
        typer.Option(
            "--autostop",
            metavar="DURATION|never",
            help="with --cluster: end the cluster after this long with no job and idle GPUs "
            "[10m]; never needs --yes",
        ),
    ] = None,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="with --cluster: fail (exit 3) while another job runs"),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="leave out of the sync the workdir's files under checkpoint.dir that the run "
            "may take for a checkpoint (the submit names them), so it starts without them",
        ),
    ] = False,
    remote: Annotated[
        bool,
        typer.Option(
            "--remote/--no-remote",
            help="on the controller host (`orch controller up`); the default once one is set up",
        ),
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="refuse (exit 2) a run or setup that names a script or module the workdir "
            "does not hold, rather than warn",
        ),
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Run a job: provision nodes, sync, train, pull checkpoints, shut the nodes down.

    With --cluster NAME the nodes are kept for the next job on NAME: it launches nothing,
    syncs only what changed and runs `setup` only when it changed. Jobs on one cluster run
    one after another (a submit waits its turn, or fails with --no-wait); the cluster bills
    between jobs too, until `orch down NAME` or its autostop.

    In the foreground this process is the job's controller (Ctrl-C cancels the job); with
    --detach a background controller drives it and the job id is printed on the last line.
    On a paid provider (aws), a job with neither budget.max_cost_usd nor budget.max_runtime
    shows its hourly price and asks first (exit 2 without a terminal; --yes for scripts);
    controller.default_max_runtime gives such jobs a max_runtime instead.
    Under a monthly budget (budget.monthly_usd, budget.user_monthly_usd in config.yaml) a
    job whose planned cost does not fit in what is left this month is refused (exit 4).

    With --remote (or whenever a controller host is set up, unless --no-remote) the job goes
    to the controller host, which drives it while this machine is off; `orch status`, `logs`
    and `cancel` of the job ask the host.

    A `python X.py` or `python -m MODULE` in run or setup that the workdir (as synced) does
    not hold is a warning with the closest names it does hold; with --strict, an error.
    """
    from orchestrator.cli.stale_files import print_stale
    from orchestrator.control import commands
    from orchestrator.report.documents import job_document
    from orchestrator.spec.loading import assignment_overrides

    if remote:  # `controller_host.route` sends a --remote submit on before the app parses it
        raise SpecError(
            "orch submit --remote was not sent to a controller host",
            hint="run it as the `orch` command, after `orch controller up`",
        )
    if dry_run and detach:
        raise SpecError(
            "give --dry-run or --detach, not both",
            hint="--dry-run shows the plan and launches nothing; --detach launches the job",
        )
    settings = load_settings()
    overrides = {
        "resources.nodes": nodes,
        "resources.gpus_per_node": gpus,
        "provider": provider,
        "resources.spot": spot,
        "budget.max_cost_usd": max_cost,
        "budget.idle_timeout": idle_timeout,
        **assignment_overrides("--env", "env", env or [], os.environ),
        **assignment_overrides("--secret", "secrets", secret or [], os.environ),
    }
    kept = kept_request(cluster, autostop, no_wait, yes)
    prepared = commands.prepare_submit(settings, job_file, overrides, fresh=fresh)
    print_stale(prepared.stale)  # on stderr, also beside a JSON document
    if notify:
        prepared = dataclasses.replace(prepared, notify=notify)
    if kept is not None:
        prepared = dataclasses.replace(prepared, cluster=kept)
    loaded, plan = prepared.loaded, prepared.plan
    scripts = _script_warnings(loaded, strict=strict, shown=not (dry_run and json_out))
    if dry_run:
        team = _team_view(settings, prepared)
        if json_out:
            document = {**prepared.dry_run.document, "spec": loaded.spec.public_document()}
            document["script_warnings"] = [warning.as_dict() for warning in scripts]
            if prepared.stale is not None:
                document["stale_checkpoints"] = prepared.stale.as_dict(datetime.now(UTC))
            print_json(document if team is None else {**document, "team_budget": team.as_dict()})
        else:
            where = f" in {plan.zone}" if plan.zone else ""
            make_console().print(
                f"would launch {plan.nodes} x {plan.instance_type} ({plan.market}) on "
                f"{plan.provider}{where} at ${plan.price_per_node_hour}/node-hour "
                f"(${plan.hourly_usd}/h in all"
                + (
                    f", ${plan.cost_at_max_runtime:.2f} for max_runtime)"
                    if plan.cost_at_max_runtime is not None
                    else ")"
                ),
                highlight=False,
            )
            for note in plan.notes:
                make_console().print(f"  {note}", highlight=False)
            for line in team.lines() if team is not None else []:
                make_console().print(f"  {line}", markup=False, highlight=False)
            _print_environment(loaded.spec)
        return
    commands.check_hourly_cap(prepared)
    ledger = None
    if settings.budget.capped:  # before asking anything: a refused job is never asked about
        ledger = open_ledger(settings)
        prepared = commands.check_team_budget(settings, ledger, prepared)
    if not yes:
        _confirm_spend(loaded.spec, plan)
    ledger = ledger or open_ledger(settings)
    if detach:
        job_id = commands.submit_detached(settings, ledger, prepared).job_id
        if json_out:
            print_json(job_document(ledger, settings, ledger.get_job(job_id), detail=False))
        else:
            make_console(stderr=True).print(
                f"job {job_id} submitted; follow it with `orch status {job_id}` or "
                f"`orch logs {job_id} -f`, stop it with `orch cancel {job_id}`",
                highlight=False,
            )
            sys.stdout.write(f"{job_id}\n")
        return
    with commands.submit_foreground(settings, ledger, prepared) as foreground:
        job = foreground.job
        console = make_console(stderr=json_out)
        console.print(f"job [bold]{job.id}[/] submitted ({loaded.source.name})")
        # SIGINT too: a shell starts background jobs with SIGINT ignored, and `orch cancel`,
        # Ctrl-C and SIGTERM must all reach a foreground controller the same way.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        signal.signal(signal.SIGINT, _raise_interrupt)
        from orchestrator.cli.console import RichReporter

        with RichReporter(console, job.id) as reporter:
            outcome = foreground.run(reporter).outcome
    document = job_document(ledger, settings, ledger.get_job(job.id), detail=json_out)
    if json_out:
        print_json(document)
    else:
        style = "green" if outcome.state is JobState.SUCCEEDED else "red"
        held, any_kept = _kept_phrase(ledger, job.id)
        where = _kept_where(loaded.spec.checkpoint, settings.job_dir(job.id) / "checkpoints")
        step = "" if document["step"] is None else f"step {document['step']}, "
        console.print(
            f"[{style}]{outcome.state.value}[/] job {job.id}: {step}"
            f"spend ${document['spend_usd']:.4f}, "
            + escape(f"{held}{', in ' + where if any_kept and where else ''}"),
            highlight=False,
        )
        if outcome.reason and outcome.state is not JobState.SUCCEEDED:
            console.print(outcome.reason, markup=False, highlight=False)
        console.print(f"bill: orch cost --job {job.id}")
    raise typer.Exit(outcome.exit_code)


app.command(name="status")(status_command)


app.command(name="logs")(logs_command)


@app.command()
def wait(
    job_id: Annotated[str, typer.Argument(help="job id", show_default=False)],
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            parser=duration,
            metavar=DURATION_METAVAR,
            help="give up after this long (exit 124), e.g. 2h",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Block until a job ends, then exit with its exit code (0 succeeded, 1 failed, 4 budget,
    5 stalled, 130 cancelled; 124 when --timeout passed first). Its controller drives it
    meanwhile."""
    from orchestrator.control.waiting import job_exit_code, wait_for_end
    from orchestrator.report.documents import job_document

    settings = load_settings()
    ledger = open_ledger(settings)
    job = wait_for_end(settings, ledger, job_id, timeout_s=timeout)
    if job is None:
        state = ledger.get_job(job_id).state
        make_console(stderr=True).print(f"job {job_id} is still {state} after --timeout")
        raise typer.Exit(124)
    if json_out:
        print_json(job_document(ledger, settings, job, detail=False))
    else:
        reason = f": {job.reason}" if job.reason else ""
        make_console().print(f"job {job_id} {job.state}{reason}", highlight=False, markup=False)
    raise typer.Exit(job_exit_code(job))


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="job id")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="a job another machine drives: take its lease and end its nodes from here, "
            "skipping that machine's controller (no SIGTERM to the trainers, no checkpoint "
            "pulled)",
        ),
    ] = False,
) -> None:
    """Cancel a job: its trainers checkpoint, the checkpoint is pulled, nodes shut down; then
    it says what the job keeps (the newest checkpoints, with their steps and ages). A job
    another machine drives is cancelled by that machine's controller, asked through the
    ledger."""
    from orchestrator.control.cancel import CancelRoute
    from orchestrator.control.cancel import cancel as cancel_job
    from orchestrator.ledger.store import ControllerLease

    settings = load_settings()
    console = make_console()

    def signalled(pid: int) -> None:
        console.print(f"cancelling {job_id}: its controller stops the trainers and the nodes")

    def asked(lease: ControllerLease) -> None:
        console.print(
            f"cancelling {job_id}: asked its controller on machine {lease.machine} through the "
            "ledger; it stops the trainers and the nodes",
            highlight=False,
        )

    def forced(lease: ControllerLease) -> None:
        make_console(stderr=True).print(
            f"warning: --force: took the lease of {job_id} from its controller on machine "
            f"{lease.machine}, which stops at its next renewal; its trainers get no SIGTERM "
            "and no checkpoint is pulled",
            highlight=False,
        )

    ledger = open_ledger(settings)
    result = cancel_job(
        settings, ledger, job_id, force=force, on_signalled=signalled,
        on_asked=asked, on_forced=forced,
    )  # fmt: skip
    if result.route is CancelRoute.ALREADY_ENDED:
        console.print(f"job {job_id} already ended: {result.state}")
        return
    if result.route in (CancelRoute.CONTROLLER, CancelRoute.ASKED):
        console.print(f"job {job_id}: {result.state.value}")
    else:
        how = " by force" if result.route is CancelRoute.FORCED else ""
        console.print(f"job {job_id}: CANCELLED{how} ({len(result.terminated)} node(s) terminated)")
    console.print(_kept_phrase(ledger, job_id)[0], highlight=False, markup=False)


app.command(name="cost")(cost_command)


@app.command()
def report(
    job_id: Annotated[str, typer.Argument(help="job id")],
    out: Annotated[
        Path | None, typer.Option("--out", help="file to write [ORCH_HOME/jobs/<id>/report.png]")
    ] = None,
    html: Annotated[
        bool, typer.Option("--html", help="an HTML page with the picture and the job's tables")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Draw a job: GPU use per node, rank 0's loss, step and throughput, spend and budget,
    events and checkpoints, why it failed; prints the file written."""
    from orchestrator.report.write import write_report

    settings = load_settings()
    result = write_report(settings, open_ledger(settings), job_id, out=out, html=html)
    if json_out:
        print_json(result.as_dict())
    else:
        sys.stdout.write(f"{result.path}\n")


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
    from orchestrator.cli.init import init_command
    from orchestrator.cli.local import app as local_app
    from orchestrator.cli.sandbox import sandbox_app
    from orchestrator.cli.shell import ssh_command, ssh_config_command

    app.add_typer(local_app, name="local")
    app.add_typer(sandbox_app, name="sandbox")
    app.add_typer(controller_host_app, name="controller")
    app.command(name="ssh")(ssh_command)
    app.command(name="ssh-config")(ssh_config_command)
    app.command(name="init")(init_command)
    app.command(name="check")(check_command)


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
    from orchestrator.control.supervision import refused_by_last_controller, revive

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
        from orchestrator.cli.controller_host import route  # jobs that live on the host

        if (code := route(sys.argv)) is not None:
            sys.exit(code)
        command()
    except OrchError as exc:
        make_console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        make_console(stderr=True).print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
