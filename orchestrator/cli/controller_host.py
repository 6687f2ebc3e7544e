"""`orch controller up|status|logs|down`, and the routing of a job that lives on the host.

`route` runs before the app parses anything: `orch submit ... --remote` (or any `orch submit`
once a controller host is set up, unless `--no-remote` or `--dry-run`) submits on the host, and
`orch status|logs|cancel JOB` for a job submitted there ask the host's orch and show its answer
here (`--json` stays one document: the host's).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.context import load_settings
from orchestrator.cli.flags import DURATION_METAVAR, JsonFlag, duration
from orchestrator.cli.output import make_console
from orchestrator.errors import SpecError

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.host.record import HostRecord

app = typer.Typer(
    name="controller",
    help="An always-on controller host that drives this ORCH_HOME's jobs (see "
    "docs/controller-host.md).",
    no_args_is_help=True,
)


def _print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, default=str) + "\n")


def _show(document: dict[str, Any], json_out: bool) -> None:
    if json_out:
        _print_json(document)
        return
    console = make_console()
    for key, value in document.items():
        if value not in (None, [], ""):
            console.print(f"{key}: {value}", highlight=False, markup=False)


@app.command()
def up(
    host: Annotated[
        str | None, typer.Option("--host", help="adopt this machine: user@addr")
    ] = None,
    port: Annotated[int | None, typer.Option("--port", help="its sshd port [22]")] = None,
    identity: Annotated[
        Path | None, typer.Option("--identity", help="private key to log in with")
    ] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="launch the host: local or aws")
    ] = None,
    instance_type: Annotated[
        str | None,
        typer.Option("--instance-type", help="EC2 type of an aws host [t3.small]"),
    ] = None,
    autostop: Annotated[
        float,
        typer.Option(
            "--autostop",
            parser=duration,
            metavar=DURATION_METAVAR,
            help="stop after this long with no job to drive (0: never) [10m]",
        ),
    ] = 600.0,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="replace the host even when only SSH says it is dead (its provider reports "
            "it running, or it is adopted)",
        ),
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Set up the controller host: adopt a machine (--host) or launch one (--provider local|aws),
    install this orch there and start its supervised daemon. When this ORCH_HOME's host is
    dead, end what is left of it and hand its jobs over to the new one (by default a host of
    the same kind: a launched one is launched again). A host that does not answer over SSH
    but that its provider reports running is left alone, with why SSH failed, unless --force."""
    from orchestrator.cli import host_billing
    from orchestrator.host import handover, lifecycle
    from orchestrator.host.record import load
    from orchestrator.host.replacement import (
        hand_over_kept,
        probe,
        refusal,
        retire_dead,
        what_ends,
    )

    if host is not None and provider is not None:
        raise SpecError("give one of --host user@addr and --provider local, not both")
    if provider is not None and provider not in ("local", "aws"):
        raise SpecError(f"--provider {provider}: a host is launched on local or aws")
    if instance_type is not None and provider != "aws":
        raise SpecError("--instance-type is for a host launched with --provider aws")
    settings = load_settings()
    replaced = None
    if (record := load(settings.home)) is not None:
        health = probe(settings, record)
        if health.alive:
            _show(_restart_or_refuse(settings, record), json_out)
            return
        if health.unconfirmed and not force:
            raise refusal(record, health)
        if health.unconfirmed:
            make_console(stderr=True).print(
                f"--force: replacing the controller host {record.user}@{record.host}:"
                f"{record.port} ({health.reason}): {what_ends(record)}",
                highlight=False,
                markup=False,
            )
        if host is None and provider is None:
            if record.kind != "launched":
                raise SpecError(
                    f"the controller host {record.user}@{record.host}:{record.port} is dead: "
                    f"{health.reason}",
                    hint="give the machine to take its place: --host user@addr (or launch "
                    "one: --provider local)",
                )
            provider = record.provider or "local"
        replaced = retire_dead(settings, record, health)
        host_billing.close_lease(
            settings, replaced["terminated"], replaced.get("billing_stopped_at")
        )
        make_console(stderr=True).print(
            f"the controller host {replaced['host']} is dead: {replaced['reason']}; "
            f"bringing up a new one to take over its {len(replaced['jobs'])} job(s)",
            highlight=False,
            markup=False,
        )
    if host is None and provider is None:
        raise SpecError("give one of --host user@addr and --provider local")
    environ = dict(os.environ)
    if host is not None:
        document = lifecycle.adopt(
            settings,
            host,
            port=port,
            identity=str(identity) if identity else None,
            autostop_s=autostop,
            environ=environ,
        )
    else:
        launched: list[str] = []

        def bill(record: HostRecord) -> None:
            host_billing.open_lease(settings, record)
            launched.append(str(record.instance_id))

        try:
            if provider == "aws":
                from orchestrator.host import aws_host
                from orchestrator.providers.aws.host_node import DEFAULT_HOST_TYPE

                document = aws_host.launch(
                    settings,
                    instance_type=instance_type or DEFAULT_HOST_TYPE,
                    autostop_s=autostop,
                    environ=environ,
                    on_launched=bill,
                )
            else:
                document = lifecycle.launch(
                    settings, autostop_s=autostop, environ=environ, on_launched=bill
                )
        except BaseException:
            for instance_id in launched:  # the failed launch was terminated: billing stopped
                host_billing.close_lease(settings, instance_id, datetime.now(UTC))
            raise
    # The dead host's jobs; with no host recorded, those of kits a replacement that failed
    # half-way left (`down` removes the kits).
    jobs = replaced["jobs"] if replaced is not None else handover.kept_jobs(settings.home)
    if replaced is not None or jobs:
        console = make_console(stderr=True)
        handed = hand_over_kept(
            settings, jobs, say=lambda line: console.print(line, highlight=False, markup=False)
        )
        document = {**document, "replaced": replaced, **handed}
        _say_hand_over(document)
    _show(document, json_out)


def _restart_or_refuse(settings: Settings, record: HostRecord) -> dict[str, Any]:
    """`up` with a live host: start its daemon again when it is not running; refuse when it
    is."""
    from orchestrator.errors import ControllerHostError
    from orchestrator.host.lifecycle import restart, status_document

    if status_document(settings, record)["running"]:
        raise ControllerHostError(
            f"this ORCH_HOME has a controller host already ({record.user}@{record.host}), "
            "and it runs",
            hint="`orch controller status` shows it; `orch controller down` first to replace it",
        )
    make_console(stderr=True).print(
        f"the controller host {record.user}@{record.host}:{record.port} answers but orch's "
        "daemon there is not running: starting it again",
        highlight=False,
        markup=False,
    )
    return restart(settings, record)


def _say_hand_over(document: dict[str, Any]) -> None:
    console = make_console(stderr=True)
    for job_id in document["handed_over"]:
        how = " (rebuilt from its running nodes)" if job_id in document["rebuilt"] else ""
        console.print(
            f"job {job_id}: handed over to the new host{how}", highlight=False, markup=False
        )
    for note in document["notes"]:
        console.print(note, highlight=False, markup=False)
    for job_id, why in document["lost"].items():
        console.print(f"job {job_id}: not handed over: {why}", highlight=False, markup=False)


@app.command()
def status(json_out: JsonFlag = False) -> None:
    """The host, its orch version, uptime, the jobs it drives and the autostop left."""
    from orchestrator.cli.host_billing import settle
    from orchestrator.host.lifecycle import status_document
    from orchestrator.host.record import require

    settings = load_settings()
    record = require(settings.home)
    settle(settings)
    _show(status_document(settings, record), json_out)


@app.command()
def logs(
    tail: Annotated[int, typer.Option("--tail", min=1, help="last N lines")] = 100,
) -> None:
    """The controller-host daemon's log."""
    from orchestrator.host.lifecycle import logs as host_logs

    sys.stdout.write(host_logs(load_settings(), tail))


@app.command()
def down(
    force: Annotated[
        bool, typer.Option("--force", help="even while the host drives unfinished jobs")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Stop orch on the host; a launched host is terminated, an adopted one left running."""
    from orchestrator.cli.host_billing import close_lease
    from orchestrator.host.lifecycle import down as host_down

    settings = load_settings()
    done = host_down(settings, force=force)
    close_lease(settings, done.get("terminated"), done.get("billing_stopped_at"))
    _show(done, json_out)


@app.command(hidden=True)
def rebuild(
    job_ids: Annotated[list[str], typer.Argument(help="ids of the jobs handed over")],
    json_out: JsonFlag = False,
) -> None:
    """Run on a new controller host by `orch controller up`: write each handed-over job its
    ledger does not know into it, from the job's kit and its running nodes
    (`control.rebuild`). Prints {"jobs": {id: {"status", "detail"}}}."""
    from orchestrator.cli.context import open_ledger
    from orchestrator.control.rebuild import rebuild as rebuild_job
    from orchestrator.providers import get_provider

    settings = load_settings()
    ledger = open_ledger(settings)
    providers: dict[str, Any] = {}

    def provider_named(name: str) -> Any:
        if name not in providers:
            providers[name] = get_provider(name, settings)
        return providers[name]

    done = {job_id: rebuild_job(settings, ledger, job_id, provider_named) for job_id in job_ids}
    document = {"jobs": {j: {"status": r.status, "detail": r.detail} for j, r in done.items()}}
    if json_out:
        _print_json(document)
        return
    console = make_console()
    for job_id, result in done.items():
        console.print(f"job {job_id}: {result.status}: {result.detail}", highlight=False,
                      markup=False)  # fmt: skip


# --- routing of jobs that live on the host ----------------------------------------------------


# Commands that, for a job living on the controller host, run there (see `route`).
ROUTED = ("submit", "status", "logs", "cancel", "wait", "report", "ssh")
# Their options that take a value as the next argument, never a job id.
VALUE_OPTIONS = frozenset(
    {"--out", "--node", "-n", "-L", "--tail", "--since", "--interval", "--rank", "--timeout",
     "--limit"}
)  # fmt: skip


def _first_positional(args: list[str]) -> int | None:
    """The index of the first argument that is neither an option nor an option's value."""
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--":
            return None
        elif arg in VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return i
    return None


def route(argv: list[str]) -> int | None:
    """Handle `argv` (sys.argv) here when it concerns the controller host; returns the exit
    status, or None to let the app run it (after removing `--no-remote` from `argv`)."""
    args = argv[1:]
    if args and args[0] == "cost" and (job := _option_value(args, "--job")) is not None:
        return _route_job_cost(args, job)
    if not args or args[0] not in ROUTED or "--help" in args:
        return None
    verb, rest = args[0], args[1:]
    if verb == "submit":
        return _route_submit(argv, rest)
    index = _first_positional(rest)
    if index is None:
        return None
    from orchestrator.host.remote_jobs import ask, lives_on_host, refresh_kit, stream

    settings = load_settings()
    if not lives_on_host(settings, rest[index]):
        return None
    if verb == "report":
        return _route_report(settings, rest, rest[index])
    if verb == "ssh":
        return _route_ssh(settings, rest, rest[index])
    if verb in ("logs", "wait"):
        # passed through as it comes: a job's whole log can be far larger than what a captured
        # command keeps (`NodeConnection.run`'s max_output)
        return stream(settings, [verb, *rest])
    if verb == "status":
        from contextlib import suppress

        from orchestrator.errors import OrchError

        with suppress(OrchError):  # the host's answer below says what is wrong
            refresh_kit(settings, rest[index])  # a kit the submit left without the job's key
    if verb == "status" and "--json" in rest and "--watch" not in rest:
        result = ask(settings, ["status", *rest])
        if result.ok:
            document = json.loads(result.stdout)
            _keep_carried(settings, rest[index], document)
            _print_json(_with_host_line(settings, document))
            sys.stderr.write(result.stderr)
            return 0
    elif verb == "status" and "--watch" not in rest:
        result = ask(settings, ["status", *rest, "--json"])
        if result.ok:
            from orchestrator.cli.console import job_detail

            document = json.loads(result.stdout)
            _keep_carried(settings, rest[index], document)
            console = make_console()
            for renderable in job_detail(document):
                console.print(renderable)
            return 0
    else:
        result = ask(settings, [verb, *rest], timeout=3600)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exited


def _keep_carried(settings: Settings, job_id: str, document: object) -> None:
    """Keep in the job's kit what the host said of it (`control.carried`), for a rebuild if
    the host dies; an answer out of shape is said on stderr and the figures kept before stay."""
    from orchestrator.control.carried import from_status
    from orchestrator.errors import OrchError
    from orchestrator.host.handover import save_carried

    try:
        figures = from_status(document, job_id=job_id, as_of=datetime.now(UTC))
        save_carried(settings.home, job_id, figures.to_json())
    except (ValueError, OrchError, OSError) as exc:
        sys.stderr.write(
            f"[orch] the controller host's figures of job {job_id} were not kept for a "
            f"hand-over: {exc}\n"
        )


def _route_job_cost(args: list[str], job_id: str) -> int | None:
    """`orch cost --job JOB` of a job on the host: the host's answer, passed through. Any
    other job costs one small file's read here (no settings, no SSH)."""
    from orchestrator.cli.context import orch_home
    from orchestrator.host.record import load

    record = load(orch_home())
    if record is None or job_id not in record.jobs:
        return None
    from orchestrator.host.remote_jobs import ask

    result = ask(load_settings(), args)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exited


def _route_ssh(settings: Settings, rest: list[str], job_id: str) -> int:
    """`orch ssh JOB` of a job on the host (see `remote_jobs.ssh_via_host`)."""
    from orchestrator.host.remote_jobs import ssh_via_host

    return ssh_via_host(settings, rest, interactive=sys.stdin.isatty())


def _route_report(settings: Settings, rest: list[str], job_id: str) -> int:
    """`orch report JOB` of a job on the host: drawn there (its ledger holds the job), the
    picture or page written here, where `--out` says or at this ORCH_HOME's default path."""
    from orchestrator.host.remote_jobs import fetch_report
    from orchestrator.report.write import default_report_path

    html = "--html" in rest
    out_arg = _option_value(rest, "--out")
    out = Path(out_arg) if out_arg else default_report_path(settings, job_id, html=html)
    out = out.expanduser().absolute()
    flags = [flag for flag in ("--html", "--json") if flag in rest]
    result = fetch_report(settings, ["report", job_id, *flags], out)
    if not result.ok:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.exited
    if "--json" in rest:
        _print_json({**json.loads(result.stdout), "path": str(out)})
    else:
        sys.stdout.write(f"{out}\n")
    return 0


def _option_value(args: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in `args`; None when absent."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def _with_host_line(settings: Settings, job: dict[str, Any]) -> dict[str, Any]:
    """The host's document of a job it drives, with the host's own line of the bill
    (`controller_host`; None for an adopted host, which orch does not bill) and the sum of
    both (`spend_with_host_usd`: the host's whole line, not a share of it)."""
    from decimal import Decimal

    from orchestrator.cli.host_billing import host_line

    line = host_line(settings)
    job = {**job, "controller_host": line}
    if line is not None and job.get("spend_usd") is not None:
        total = Decimal(str(job["spend_usd"])) + Decimal(str(line["spend_usd"]))
        job["spend_with_host_usd"] = float(total)
    return job


def _route_submit(argv: list[str], rest: list[str]) -> int | None:
    from orchestrator.host.record import load

    if "--no-remote" in rest:
        argv.remove("--no-remote")
        return None
    settings = load_settings()
    wanted = "--remote" in rest or ("--dry-run" not in rest and load(settings.home) is not None)
    if not wanted:
        return None
    index = _first_positional(rest)
    if index is None:
        raise SpecError("orch submit --remote needs the job spec file")
    from orchestrator.host.remote_jobs import submit

    job_id, result = submit(settings, rest, index, dict(os.environ))
    if not result.ok:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.exited
    if "--json" in rest:
        sys.stdout.write(result.stdout)
    else:
        make_console(stderr=True).print(
            f"job {job_id} submitted to the controller host; follow it with "
            f"`orch status {job_id}` or `orch logs {job_id}`",
            highlight=False,
            markup=False,
        )
        sys.stdout.write(f"{job_id}\n")
    return 0
