"""A job command's steps once typer has parsed it: which `Jobs` answers for a job
(`jobs_for`: `HostJobs` for a job this ORCH_HOME submitted to its controller host, else
`LocalJobs`), and what only the command line adds to the host's answer: its line of the bill,
the figures kept for a hand-over, the report file written here, the terminal of `orch ssh`.

Light at import: a command of a job that does not live on the host reads one small file
(host.json) more and imports nothing else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.context import load_settings, orch_home
from orchestrator.cli.output import make_console

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.control.verbs.jobs import Jobs, SubmitRequest


def _print_line(document: object) -> None:
    """A --json document on one line, as the host's answers were always shown."""
    sys.stdout.write(json.dumps(document, default=str) + "\n")


def lives_on_host(job_id: str | None) -> bool:
    """Whether `job_id` is a job this ORCH_HOME submitted to its controller host (host.json
    read; no settings, no SSH)."""
    if job_id is None:
        return False
    from orchestrator.control.verbs.host_jobs import lives_on_host as on_host

    return on_host(orch_home(), job_id)


def jobs_for(job_id: str | None) -> Jobs[Any]:
    """The jobs that answer for `job_id`: the controller host's when it lives there (what its
    orch says on stderr beside an answer is passed on), else this ledger's."""
    if lives_on_host(job_id):
        from orchestrator.control.verbs.host_jobs import HostJobs

        return HostJobs(load_settings(), stderr=sys.stderr.write)
    from orchestrator.control.verbs.local_jobs import LocalJobs

    return LocalJobs(load_settings())


@contextmanager
def passed_on() -> Iterator[None]:
    """The host's orch refusing (`HostRefused`): what it printed, passed on as it printed it,
    and its exit status."""
    from orchestrator.control.verbs.host_jobs import HostRefused

    try:
        yield
    except HostRefused as refused:
        sys.stdout.write(refused.stdout)
        sys.stderr.write(refused.stderr)
        raise typer.Exit(refused.exit_code) from None


def describe_on_host(job_id: str, *, json_out: bool, events: int | None) -> None:
    """`orch status JOB` of a job on the host: its document there, the figures kept here for
    a hand-over; with --json the document with the host's line of the bill. `events`: the
    rows of events shown (`console.job_detail`; None: all)."""
    from orchestrator.control.verbs.host_jobs import HostJobs

    settings = load_settings()
    with passed_on():
        document = HostJobs(settings, stderr=sys.stderr.write).describe(job_id)
    _keep_carried(settings, job_id, document)
    if json_out:
        _print_line(_with_host_line(settings, document))
        return
    from orchestrator.cli.console import job_detail

    console = make_console()
    for renderable in job_detail(document, events=events):
        console.print(renderable)


def watch_on_host(argv: list[str]) -> int:
    """`orch status JOB --watch` of a job on the host: the host's view, passed on when done."""
    from orchestrator.host.remote_jobs import ask

    result = ask(load_settings(), argv, timeout=3600)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exited


def _keep_carried(settings: Settings, job_id: str, document: object) -> None:
    """Keep in the job's kit what the host said of it (`control.repair.carried`), for a rebuild if
    the host dies; an answer out of shape is said on stderr and the figures kept before stay."""
    from orchestrator.control.repair.carried import from_status
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


def submit_on_host(request: SubmitRequest) -> None:
    """`orch submit` sent to the controller host (`control.verbs.jobs.submit` on `HostJobs`)."""
    from orchestrator.control.verbs.host_jobs import HostJobs
    from orchestrator.control.verbs.jobs import submit

    jobs = HostJobs(load_settings())
    with passed_on():
        job_id = submit(jobs, request)
    if request.json_out:
        sys.stdout.write(jobs.submitted_output)
        return
    make_console(stderr=True).print(
        f"job {job_id} submitted to the controller host; follow it with "
        f"`orch status {job_id}` or `orch logs {job_id}`",
        highlight=False,
        markup=False,
    )
    sys.stdout.write(f"{job_id}\n")


def wait_on_host(job_id: str, *, timeout: float | None, json_out: bool) -> int:
    """`orch wait JOB` of a job on the host: its orch's wait, passed through as it comes."""
    from orchestrator.host.remote_jobs import stream

    argv = ["wait", job_id, *(["--timeout", str(timeout)] if timeout is not None else [])]
    return stream(load_settings(), argv + (["--json"] if json_out else []))


def report_on_host(job_id: str, *, out: Path | None, html: bool, json_out: bool) -> int:
    """`orch report JOB` of a job on the host: drawn there (its ledger holds the job), the
    picture or page written here, where `--out` says or at this ORCH_HOME's default path."""
    from orchestrator.host.remote_jobs import fetch_report
    from orchestrator.report.write import default_report_path

    settings = load_settings()
    out = out if out is not None else default_report_path(settings, job_id, html=html)
    out = out.expanduser().absolute()
    flags = [flag for flag, on in (("--html", html), ("--json", json_out)) if on]
    result = fetch_report(settings, ["report", job_id, *flags], out)
    if not result.ok:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.exited
    if json_out:
        _print_line({**json.loads(result.stdout), "path": str(out)})
    else:
        sys.stdout.write(f"{out}\n")
    return 0


def ssh_on_host(name: str, node: int, forwards: list[str], command: list[str]) -> int:
    """`orch ssh JOB` of a job on the host (see `remote_jobs.ssh_via_host`)."""
    from orchestrator.host.remote_jobs import ssh_via_host

    argv = [name, "--node", str(node)]
    for forward in forwards:
        argv += ["-L", forward]
    argv += ["--", *command] if command else []
    return ssh_via_host(load_settings(), argv, interactive=sys.stdin.isatty())
