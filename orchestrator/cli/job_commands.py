"""`orch wait`, `orch cancel` and `orch report` of one job: this ledger's, or one that lives
on the controller host (`cli.on_host`), chosen once typer has parsed the arguments."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import DURATION_METAVAR, JsonFlag, duration
from orchestrator.cli.on_host import lives_on_host
from orchestrator.cli.output import make_console, print_json


def wait_command(
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
    if lives_on_host(job_id):
        from orchestrator.cli.on_host import wait_on_host

        raise typer.Exit(wait_on_host(job_id, timeout=timeout, json_out=json_out))
    from orchestrator.control.verbs.wait import job_exit_code, wait_for_end
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


def cancel_command(
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
    from orchestrator.cli.on_host import jobs_for, passed_on

    console, errors = make_console(), make_console(stderr=True)

    def say(text: str, err: bool) -> None:
        (errors if err else console).print(text, highlight=False, markup=False)

    with passed_on():
        outcome = jobs_for(job_id).cancel(job_id, force=force, say=say)
    for line in outcome.lines(job_id):
        console.print(line, highlight=False, markup=False)


def report_command(
    job_id: Annotated[str, typer.Argument(help="job id")],
    out: Annotated[
        Path | None, typer.Option("--out", help="file to write [ORCH_HOME/jobs/<id>/report.png]")
    ] = None,
    html: Annotated[
        bool, typer.Option("--html", help="an HTML page with the picture and the job's tables")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Draw a job: GPU use and memory per node, rank 0's loss, step and throughput, spend and
    budget, events and checkpoints, why it failed; prints the file written."""
    if lives_on_host(job_id):
        from orchestrator.cli.on_host import report_on_host

        raise typer.Exit(report_on_host(job_id, out=out, html=html, json_out=json_out))
    from orchestrator.report.write import write_report

    settings = load_settings()
    result = write_report(settings, open_ledger(settings), job_id, out=out, html=html)
    if json_out:
        print_json(result.as_dict())
    else:
        sys.stdout.write(f"{result.path}\n")
