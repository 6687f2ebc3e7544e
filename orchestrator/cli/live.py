"""`orch status JOB --watch`: a live view of one job that refreshes until the job is final."""

from __future__ import annotations

import signal
import time
from decimal import Decimal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from orchestrator.cli.console import events_table, gpu_table, revived_line
from orchestrator.config import Settings
from orchestrator.control.process.controllers import refused_by_last_controller, revive_controllers
from orchestrator.errors import SpecError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger
from orchestrator.report.data import budget_from_spec
from orchestrator.report.documents import job_document

DEFAULT_INTERVAL = 2.0  # seconds between refreshes
RECENT_EVENTS = 8
STATE_STYLE = {JobState.SUCCEEDED: "green", JobState.RUNNING: "cyan"}


def live_view(doc: dict, budget_usd: Decimal | None = None) -> RenderableType:
    """The watch view of a job's status document: state, step/loss, spend and hourly rate
    (against the budget when there is one), the latest GPU/CPU readings, recent events."""
    state = JobState(doc["state"])
    style = STATE_STYLE.get(state, "red" if state.is_final else "yellow")
    summary = Table.grid(padding=(0, 2))
    summary.add_row("[bold]job[/]", escape(doc["id"]))
    summary.add_row("[bold]state[/]", f"[{style}]{state.value}[/]")
    progress = "no step reported yet" if doc["step"] is None else f"step {doc['step']}"
    if doc.get("loss") is not None:
        progress += f", loss {doc['loss']:.4f}"
    summary.add_row("[bold]progress[/]", progress)
    spend = f"${doc['spend_usd']:.4f}, now ${doc['hourly_usd']:g}/h"
    if budget_usd is not None:
        spend += f" (budget ${budget_usd})"
    summary.add_row("[bold]spend[/]", spend)
    if doc.get("elapsed_s") is not None:
        summary.add_row("[bold]elapsed[/]", f"{doc['elapsed_s']:.0f} s")
    if doc.get("recoveries"):
        summary.add_row("[bold]recoveries[/]", str(doc["recoveries"]))
    if state.is_final and doc.get("reason"):
        summary.add_row("[bold]reason[/]", escape(doc["reason"].splitlines()[0]))
    parts: list[RenderableType] = [summary]
    if doc.get("gpus"):
        parts.append(gpu_table(doc))
    parts.append(events_table(doc, limit=RECENT_EVENTS))
    return Group(*parts)


def change_lines(before: dict | None, doc: dict) -> list[str]:
    """The plain lines a piped watch prints for what changed from status document `before`
    (None: the first look) to `doc`: one for the job when its state, step, loss or spend (to
    the cent) moved, one per new event. Pure."""
    now = (doc["state"], doc["step"], doc.get("loss"), round(doc["spend_usd"], 2))
    was = None
    if before is not None:
        was = (before["state"], before["step"], before.get("loss"), round(before["spend_usd"], 2))
    lines = []
    if now != was:
        parts = [doc["state"], "no step yet" if doc["step"] is None else f"step {doc['step']}"]
        if doc.get("loss") is not None:
            parts.append(f"loss {doc['loss']:.4f}")
        parts.append(f"spend ${doc['spend_usd']:.4f}")
        if JobState(doc["state"]).is_final and doc.get("reason"):
            parts.append(doc["reason"].splitlines()[0])
        lines.append(f"{doc['id']} " + " | ".join(parts))
    seen = len(before.get("events", [])) if before is not None else 0
    for event in doc.get("events", [])[seen:]:
        message = event["message"].splitlines()[0] if event["message"] else ""
        lines.append(f"{doc['id']} event {event['at'][11:19]} {event['kind']} {message}".rstrip())
    return lines


def watch_job(
    settings: Settings, ledger: Ledger, job_id: str, *, interval: float, console: Console
) -> dict:
    """Show the job live, re-read every `interval` seconds, until it is final; returns its
    last status document. On a console that is not a terminal (a pipe, a file) a plain line is
    printed for each change instead (`change_lines`), as it happens, after a first line saying
    what is watched, and the final view once the job is final. KeyboardInterrupt
    (Ctrl-C) leaves the last view on screen and propagates; the job itself goes on."""
    job = ledger.get_job(job_id)
    budget = budget_from_spec(job.spec_json)
    if not console.is_terminal:
        return _print_changes(settings, ledger, job_id, interval=interval, console=console)
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            job = ledger.get_job(job_id)
            doc = job_document(ledger, settings, job)
            live.update(live_view(doc, budget), refresh=True)
            if JobState(job.state).is_final:
                return doc
            _revive(settings, ledger, job_id, live.console)
            time.sleep(interval)


def _revive(settings: Settings, ledger: Ledger, job_id: str, console: Console) -> None:
    if revive_controllers(settings, ledger, [job_id]):
        console.print(
            revived_line(job_id, refused_by_last_controller(ledger, job_id)),
            highlight=False,
            markup=False,
        )


def _print_changes(
    settings: Settings, ledger: Ledger, job_id: str, *, interval: float, console: Console
) -> dict:
    console.print(f"watching {job_id} until it ends (every {interval:g} s)", highlight=False)
    budget = budget_from_spec(ledger.get_job(job_id).spec_json)
    before: dict | None = None
    while True:
        job = ledger.get_job(job_id)
        doc = job_document(ledger, settings, job)
        for line in change_lines(before, doc):
            console.print(line, highlight=False, markup=False)
        console.file.flush()
        before = doc
        if JobState(job.state).is_final:
            console.print(live_view(doc, budget))  # the whole final view, as on a terminal
            return doc
        _revive(settings, ledger, job_id, console)
        time.sleep(interval)


def watch_command(
    settings: Settings,
    ledger: Ledger,
    console: Console,
    job_id: str | None,
    *,
    watch: bool,
    json_out: bool,
    interval: float | None,
) -> None:
    """`orch status JOB --watch [--interval S]`: checks the flags (SpecError, exit 2), then
    watches the job until it is final. On Ctrl-C it says that the job goes on, and re-raises."""
    if not watch:
        raise SpecError(
            "--interval goes with --watch", hint=f"orch status {job_id or 'JOB'} --watch"
        )
    if json_out:
        raise SpecError(
            "--watch shows a live view and cannot be combined with --json",
            hint="for scripts, poll `orch status JOB --json`",
        )
    if job_id is None:
        raise SpecError("--watch needs a job id", hint="`orch status` lists jobs")
    if interval is not None and not 0 < interval <= 3600:
        raise SpecError(f"--interval must be between 0 and 3600 seconds, not {interval:g}")
    # A shell starts a background command with SIGINT ignored; `kill -INT` must still stop it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        watch_job(settings, ledger, job_id, interval=interval or DEFAULT_INTERVAL, console=console)
    except KeyboardInterrupt:
        console.print(
            f"stopped watching; job {job_id} goes on (`orch cancel {job_id}` stops it)",
            highlight=False,
        )
        raise
