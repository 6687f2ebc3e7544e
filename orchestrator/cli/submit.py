"""`orch submit`: check a job, plan it, and run it here (in the foreground, or handed to a
background controller) or on the controller host (`cli.on_host`), whichever the parsed flags
and this ORCH_HOME say (`runs_on_host`)."""

from __future__ import annotations

import dataclasses
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from click.core import ParameterSource
from rich.markup import escape

from orchestrator.cli.context import load_settings, open_ledger, orch_home
from orchestrator.cli.flags import DURATION_METAVAR, JsonFlag, duration
from orchestrator.cli.kept import kept_request
from orchestrator.cli.output import make_console, print_json
from orchestrator.control.verbs.jobs import SubmitRequest
from orchestrator.errors import SpecError
from orchestrator.job_state import JobState

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.control.money.team_caps import SubmitBudget
    from orchestrator.control.verbs.commands import PreparedSubmit
    from orchestrator.ledger.store import Ledger
    from orchestrator.providers.plan import LaunchPlan
    from orchestrator.spec.model import CheckpointSpec, JobSpec, LoadedJob
    from orchestrator.spec.script_check import ScriptWarning


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
    from orchestrator.control.money.spend_guard import needs_confirmation

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
    from orchestrator.control.money.team_caps import TeamCaps

    return TeamCaps(settings.budget, open_ledger(settings)).check_submit(
        prepared.loaded.spec.budget, prepared.plan, settings.owner_label
    )


def _print_data_warnings(prepared: PreparedSubmit) -> None:
    """On stderr: what reading a SkyPilot task changed (a mount copied instead), and the
    buckets this machine could not vouch for (`control.verbs.data_check`)."""
    data = prepared.data.warnings() if prepared.data is not None else []
    console = make_console(stderr=True)
    for line in [*prepared.loaded.notices, *data]:
        console.print(f"warning: {line}", style="yellow", markup=False, highlight=False)


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
    (`control.verbs.script_check`): printed as warnings on stderr when `shown`, refused (SpecError,
    exit 2) with --strict."""
    from orchestrator.control.verbs import script_check

    found = script_check.script_warnings(loaded)
    if strict:
        script_check.refuse(found)
    console = make_console(stderr=True)
    for warning in found if shown else []:
        console.print(f"warning: {warning.message()}", markup=False, highlight=False)
    return found


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def submit_command(
    context: typer.Context,
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)", show_default=False)],
    nodes: Annotated[int | None, typer.Option("--nodes", help="number of nodes")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs (processes) per node")] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="local, aws or ssh (a fleet)")
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet", metavar="NAME", help="run on fleet NAME (`orch fleet add`); means ssh"
        ),
    ] = None,
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
        typer.Option(
            "--no-wait",
            help="with --cluster: fail (exit 3) while another job runs; on a fleet: fail "
            "(exit 3) rather than queue while its GPUs are held",
        ),
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
    from orchestrator.control.verbs import commands
    from orchestrator.control.verbs.local_jobs import LocalJobs
    from orchestrator.report.documents import job_document

    request = SubmitRequest(
        job_file=job_file, nodes=nodes, gpus=gpus, provider=provider, fleet=fleet,
        spot=spot,
        max_cost=max_cost, idle_timeout=idle_timeout, env=tuple(env or ()),
        secret=tuple(secret or ()), notify=notify, cluster=cluster, autostop=autostop,
        no_wait=no_wait, fresh=fresh, strict=strict, yes=yes, dry_run=dry_run, json_out=json_out,
    )  # fmt: skip
    if runs_on_host(context, remote=remote, dry_run=dry_run):
        from orchestrator.cli.on_host import submit_on_host

        submit_on_host(request)
        return
    if dry_run and detach:
        raise SpecError(
            "give --dry-run or --detach, not both",
            hint="--dry-run shows the plan and launches nothing; --detach launches the job",
        )
    settings = load_settings()
    kept = kept_request(cluster, autostop, no_wait, yes)
    prepared = LocalJobs(settings).submit_dryrun(request)
    print_stale(prepared.stale)  # on stderr, also beside a JSON document
    _print_data_warnings(prepared)
    if kept is not None:
        prepared = dataclasses.replace(prepared, cluster=kept)
    loaded, plan = prepared.loaded, prepared.plan
    scripts = _script_warnings(loaded, strict=strict, shown=not (dry_run and json_out))
    if dry_run:
        team = _team_view(settings, prepared)
        if json_out:
            document = {**prepared.dry_run.document, "spec": loaded.spec.public_document()}
            if loaded.spec.container is not None:
                document["container"] = loaded.spec.container.plan_document()
            document["script_warnings"] = [warning.as_dict() for warning in scripts]
            if prepared.stale is not None:
                document["stale_checkpoints"] = prepared.stale.as_dict(datetime.now(UTC))
            if prepared.data is not None:
                document["data"] = prepared.data.as_dict()
            document["notices"] = list(loaded.notices)
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
            for line in loaded.spec.container.plan_lines() if loaded.spec.container else []:
                make_console().print(f"  {line}", markup=False, highlight=False)
            _print_environment(loaded.spec)
            for line in prepared.data.lines(loaded.spec) if prepared.data is not None else []:
                make_console().print(f"  {line}", markup=False, highlight=False)
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
        job_id = LocalJobs(settings, ledger).schedule(prepared)
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


def runs_on_host(context: typer.Context, *, remote: bool, dry_run: bool) -> bool:
    """Whether the parsed submit goes to the controller host: with --remote, or whenever this
    ORCH_HOME has a host set up, unless --no-remote was given or it is a dry run."""
    if remote:
        return True
    if context.get_parameter_source("remote") is ParameterSource.COMMANDLINE or dry_run:
        return False  # --no-remote
    from orchestrator.host.record import load

    return load(orch_home()) is not None
