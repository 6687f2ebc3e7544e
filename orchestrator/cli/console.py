"""Human output: a live progress line for a running job, tables for read commands."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.progress import Progress

    from orchestrator.node.progress import Metrics


RECENT_EVENTS = 15  # the newest rows of events `orch status JOB` shows (and state changes)


class RichReporter:
    """Shows the job's phase and rank 0's step/loss/img/s on one live line, log lines above it,
    on an interactive terminal. Elsewhere (a pipe, a file, a dumb terminal) it prints plain
    lines only, as they come: one per phase, one per new progress reading, the log lines; never
    a spinner frame, a redrawn line or a carriage return.

    Use as a context manager.
    """

    def __init__(self, console: Console, job_id: str) -> None:
        self.console = console
        self.job_id = job_id
        self._progress = _live_line(console, job_id) if console.is_interactive else None
        self._shown = ""  # the progress text last printed off a terminal
        self._first: tuple[float, int] | None = None  # (monotonic time, step) of the first report

    def __enter__(self) -> RichReporter:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._progress.task_ids[0], description=text)
        self.console.print(f"[cyan]orch[/] {escape(self.job_id)}: {escape(text)}")

    def metrics(self, metrics: Metrics) -> None:
        now = time.monotonic()
        if self._first is None or metrics.step < self._first[1]:  # a restart from scratch
            self._first = (now, metrics.step)
        parts = [step_text(metrics, self._first, now)]
        if metrics.epoch is not None:
            parts.append(f"epoch {metrics.epoch:g}")
        if metrics.loss is not None:
            parts.append(f"loss {metrics.loss:.4f}")
        if metrics.img_s is not None:
            parts.append(f"{metrics.img_s:,.0f} img/s")
        text = "running | " + " | ".join(parts)
        if self._progress is not None:
            self._progress.update(self._progress.task_ids[0], description=text)
        elif text != self._shown:
            self._shown = text
            self.console.print(text, highlight=False, markup=False)

    def line(self, text: str) -> None:
        self.console.print(Text(text, style="dim"), highlight=False)


def _live_line(console: Console, job_id: str) -> Progress:
    """The live line of an interactive terminal: spinner, job id, phase, time elapsed."""
    # imported here: the read commands' tables, from this module too, need none of it
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[job]}[/]"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    progress.add_task("submitted", job=job_id, total=None)
    return progress


def step_text(metrics: Metrics, first: tuple[float, int], now: float) -> str:
    """`step 24/48 (50%, ETA 2m10s)` when rank 0 says where the run ends (total_steps), the ETA
    from the pace since `first` (monotonic time, step); plain `step 24` otherwise. Pure."""
    if metrics.total_steps is None:
        return f"step {metrics.step}"
    text = f"step {metrics.step}/{metrics.total_steps} ({metrics.step / metrics.total_steps:.0%}"
    elapsed, done = now - first[0], metrics.step - first[1]
    left = metrics.total_steps - metrics.step
    if done > 0 and elapsed > 0 and left >= 0:
        eta = round(left * elapsed / done)
        text += ", ETA " + (f"{eta // 60}m{eta % 60:02d}s" if eta >= 60 else f"{eta}s")
    return text + ")"


def revived_line(job_id: str, refusal: str | None) -> str:
    """What a command says when it started a new controller for `job_id`; `refusal` is why
    the last one would not drive the job (`refused_by_last_controller`), if it would not."""
    if refusal is None:
        return f"orch: the controller of {job_id} was gone; a new one adopted the job"
    return (
        f"orch: the controller of {job_id} was gone and a new one was started, but the last "
        f"one refused the job: {refusal}. Run orch from the shell that started the job (its "
        "AWS profile or credentials, ORCH_AWS_REGIONS, ORCH_AWS_ENDPOINT_URL)"
    )


def jobs_table(rows: list[dict]) -> Table:
    table = Table(title="jobs")
    for column in ("id", "state", "provider", "nodes", "step", "spend", "created"):
        table.add_column(
            column, justify="right" if column in ("nodes", "step", "spend") else "left"
        )
    for row in rows:
        queue = row.get("queue")
        table.add_row(
            row["id"],
            row["state"]
            if not queue
            else f"{row['state']} ({queue['position']} of {queue['of']} on {queue['fleet']})",
            row["provider"],
            f"{row['nodes']}x{row['gpus_per_node']}",
            "" if row["step"] is None else str(row["step"]),
            f"${row['spend_usd']:.4f}",
            (row["created_at"] or "")[:19].replace("T", " "),
        )
    return table


def gpu_table(doc: dict) -> Table:
    """The latest reading of every GPU of a job (its CPU use on nodes without GPUs)."""
    gpus = Table(title="GPU utilization (latest)")
    for column in ("node", "gpu", "util %", "memory MiB", "at"):
        gpus.add_column(column)
    for item in doc.get("gpus", []):
        known = item["known"] and item["util_pct"] is not None
        memory = (
            f"{item['mem_used_mib']:.0f}/{item['mem_total_mib']:.0f}"
            if item["mem_used_mib"] is not None and item["mem_total_mib"] is not None
            else ""
        )
        gpus.add_row(
            str(item["node"]),
            "cpu" if item["gpu"] < 0 else str(item["gpu"]),
            f"{item['util_pct']:.0f}" if known else "unknown",
            memory,
            item["at"][11:19],
        )
    return gpus


def events_table(doc: dict, *, limit: int | None) -> Table:
    """The job's events: repeats collapsed, the newest `limit` rows and every state change
    before them (`event_rows.shown`), with a caption counting those left out; every event as
    it is when `limit` is None."""
    from orchestrator.cli.event_rows import as_row, shown

    events = Table(title="events")
    for column in ("at", "kind", "step", "message"):
        events.add_column(column)
    if limit is None:
        rows, left_out = [as_row(e) for e in doc.get("events", [])], 0
    else:
        rows, left_out = shown(doc.get("events", []), limit)
    for row in rows:
        events.add_row(
            row.at[11:19], row.kind, "" if row.step is None else str(row.step), Text(row.message)
        )
    if left_out:
        events.caption = (
            f"{left_out} earlier event(s) not shown: orch status {doc['id']} --events all"
        )
    return events


def job_detail(doc: dict, *, events: int | None = RECENT_EVENTS) -> list[object]:
    """Renderables describing one job: summary (with its recoveries and planned moves, when
    there were any), GPUs, leases, checkpoints, its events (`events_table`, `events` rows)."""
    summary = Table.grid(padding=(0, 2))
    for key in ("id", "state", "provider", "step", "loss", "created_at", "ended_at", "reason"):
        if doc.get(key) is not None:
            summary.add_row(f"[bold]{key}[/]", str(doc[key]))
    for key in ("recoveries", "switches"):
        if doc.get(key):
            summary.add_row(f"[bold]{key}[/]", str(doc[key]))
    summary.add_row("[bold]spend[/]", f"${doc['spend_usd']:.4f} (now ${doc['hourly_usd']:g}/h)")
    if doc.get("elapsed_s") is not None:
        summary.add_row("[bold]elapsed[/]", f"{doc['elapsed_s']:.0f} s")
    if doc.get("env"):
        shown = ", ".join(f"{k}={v}" for k, v in doc["env"].items())
        summary.add_row("[bold]env[/]", Text(shown))
    if doc.get("secrets"):
        summary.add_row("[bold]secrets[/]", f"{', '.join(doc['secrets'])} (values hidden)")
    for alert in doc.get("checkpoint_alerts", []):
        summary.add_row("[bold yellow]checkpoints[/]", Text(alert, style="yellow"))
    gpus = gpu_table(doc)
    leases = Table(title="leases")
    for column in ("rank", "instance", "market", "type", "$/h", "launched", "ended", "cost"):
        leases.add_column(column)
    for lease in doc.get("leases", []):
        leases.add_row(
            str(lease["rank"]),
            lease["instance_id"],
            lease["market"],
            lease["instance_type"],
            f"{lease['price_per_hour']:g}",
            lease["launched_at"][11:19],
            lease["ended_at"][11:19] if lease["ended_at"] else "running",
            f"${lease['cost_usd']:.4f}",
        )
    checkpoints = Table(title="checkpoints")
    for column in ("name", "step", "bytes", "kept in"):
        checkpoints.add_column(column)
    for item in doc["checkpoints"]:
        where = [item["path"]] if item.get("path") else []
        if item.get("stored"):
            where.append("the store")
        step = "" if item["step"] is None else str(item["step"])
        checkpoints.add_row(item["name"], step, str(item["size_bytes"]), " and ".join(where))
    table = events_table(doc, limit=events)
    parts: list[object] = [summary]
    if doc.get("gpus"):
        parts.append(gpus)
    parts += [leases, checkpoints]
    if doc.get("outputs"):
        parts.append(outputs_table(doc["outputs"]))
    return [*parts, table]


def outputs_table(outputs: list[dict]) -> Table:
    """The job's `outputs`, each with its last upload (or that none happened yet)."""
    table = Table(title="outputs")
    for column in ("from", "to", "last upload"):
        table.add_column(column)
    for output in outputs:
        uploads = output.get("uploads") or []
        last = f"{uploads[-1]['at'][11:19]} {uploads[-1]['message']}" if uploads else "not yet"
        where = f"{output['src']} ({'every node' if output.get('nodes') == 'all' else 'node 0'})"
        table.add_row(Text(where), Text(str(output["dst"])), Text(last))
    return table


COST_ROWS = 50  # jobs `orch cost` shows a row each (the older summed in one row)


def cost_table(doc: dict, *, limit: int | None = None) -> Table:
    """`orch cost`'s table of `cost_from`'s document: a row per job, newest first (the first
    `limit` only, and one row summing the rest), one per kept cluster's idle time, one per
    launched controller host, the total."""
    table = Table(title="spend")
    for column in ("job", "state", "provider", "leases", "node-hours", "spend"):
        table.add_column(
            column, justify="right" if column in ("leases", "node-hours", "spend") else "left"
        )
    jobs = doc["jobs"] if limit is None else doc["jobs"][:limit]
    older = doc["jobs"][len(jobs) :]
    for row in jobs:
        table.add_row(
            row["id"],
            row["state"],
            row["provider"],
            str(row["leases"]),
            f"{row['node_hours']:.4f}",
            f"${row['spend_usd']:.4f}",
        )
    if older:
        table.add_row(
            f"{len(older)} older job(s) (--all: a row each)",
            "",
            "",
            str(sum(row["leases"] for row in older)),
            f"{sum(row['node_hours'] for row in older):.4f}",
            f"${sum(row['spend_usd'] for row in older):.4f}",
        )
    for cluster in doc.get("clusters", []):
        table.add_row(
            f"{cluster['name']} (kept cluster), idle between jobs",
            cluster["state"],
            cluster["provider"],
            "",
            f"{cluster['idle_node_hours']:.4f}",
            f"${cluster['idle_usd']:.4f}",
        )
    for host in doc.get("hosts", []):
        table.add_row(
            f"controller host {host['instance_id']}",
            "running" if host["running"] else "ended",
            host["provider"],
            "",
            f"{host['hours']:.4f}",
            f"${host['spend_usd']:.4f}",
        )
    table.add_section()
    table.add_row("total", "", "", "", "", f"${doc['total_usd']:.4f}")
    return table


def clusters_table(rows: list[dict]) -> Table:
    """Kept clusters: nodes, price, who runs on them, idle time and autostop, bill."""
    table = Table(title="kept clusters")
    for column in ("name", "nodes", "$/h", "job", "queue", "idle", "autostop in", "spend"):
        table.add_column(column, justify="right" if column in ("$/h", "spend") else "left")
    for row in rows:
        left = row["autostop_left_s"]
        if row["autostop_s"] is None:
            autostop = "never"
        elif left is None:
            autostop = "(after the job)"
        else:
            autostop = _seconds(left) if left > 0 else "due now"
        table.add_row(
            row["name"],
            f"{row['nodes']}x{row['gpus_per_node']}",
            f"${row['hourly_usd']:.4f}",
            row["job"] or "",
            ", ".join(row["queue"]),
            _seconds(row["idle_s"]) if row["idle_s"] is not None else "",
            autostop,
            f"${row['total_usd']:.4f} (idle ${row['idle_usd']:.4f})",
        )
    return table


def _seconds(value: float) -> str:
    value = max(0, int(value))
    hours, rest = divmod(value, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
