"""`orch controller up|status|logs|down`, and the host's side of `HostJobs`: `orch controller
answer` (hidden) answers one request of another ORCH_HOME from this one's `LocalJobs`.

A job that lives on the host is routed there by each command once typer has parsed it
(`cli.on_host`).
"""

from __future__ import annotations

import dataclasses
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
    for job_id in document["ended"]:
        how = ", rebuilt from its nodes," if job_id in document["rebuilt"] else ""
        console.print(
            f"job {job_id}{how} has ended: `orch status {job_id}` shows how",
            highlight=False,
            markup=False,
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
    (`control.repair.rebuild`). Prints {"jobs": {id: {"status", "detail"}}}."""
    from orchestrator.cli.context import open_ledger
    from orchestrator.control.repair.rebuild import rebuild as rebuild_job
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


@app.command(hidden=True)
def answer() -> None:
    """Run on the controller host by `HostJobs`: read one request (`control.verbs.job_wire`) on
    stdin and print the reply of this ORCH_HOME's `LocalJobs` to it, one line of JSON; a refusal
    (an `OrchError`) is a reply too."""
    from orchestrator.control.verbs import job_wire
    from orchestrator.control.verbs.local_jobs import LocalJobs
    from orchestrator.errors import OrchError

    said: list[job_wire.Said] = []
    try:
        request = job_wire.read_request(sys.stdin.read(job_wire.MAX_REPLY_BYTES))
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    try:
        jobs = LocalJobs(load_settings())
        if isinstance(request, job_wire.DescribeRequest):
            document = jobs.describe(request.job_id)
        elif isinstance(request, job_wire.ListRequest):
            document = jobs.list(request.view)
        elif isinstance(request, job_wire.CostRequest):
            document = jobs.cost(request.job_id)
        else:
            outcome = jobs.cancel(
                request.job_id,
                force=request.force,
                say=lambda text, err: said.append(
                    job_wire.Said(text=text[: job_wire.MAX_TEXT], err=err)
                ),
            )
            document = dataclasses.asdict(outcome)
        reply = job_wire.Reply(
            document=job_wire.document_of(document), said=said[-job_wire.MAX_SAID :]
        )
    except OrchError as exc:
        failure = job_wire.Failure(message=str(exc)[: job_wire.MAX_TEXT], exit_code=exc.exit_code)
        reply = job_wire.Reply(said=said[-job_wire.MAX_SAID :], failure=failure)
    sys.stdout.write(job_wire.write_reply(reply) + "\n")
