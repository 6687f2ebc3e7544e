"""What each page of the dashboard shows, read from the ledger's view: plain dicts built by the
documents `orch status`, `orch cost`, `orch fleet status` and `orch report` use, so a page and
the command it stands beside always agree. No I/O but the ledger's reads and the controller's
own log mirror under ORCH_HOME."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.config import Settings
from orchestrator.errors import UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.view import LedgerView
from orchestrator.report.data import ReportData, budget_from_spec, build_report

FILTERED_LIMIT = 200  # jobs a filtered list shows, newest first
FILTER_TEXT_LIMIT = 100  # characters of a filter's text that count
LOG_CHUNK_BYTES = 64 * 1024  # the most of a node log one answer carries
MAX_NODES = 4096  # a node index beyond this is no node of any job
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STATES = tuple(state.value for state in JobState)


def safe_job_id(job_id: str) -> str:
    """`job_id` when it can name a folder under ORCH_HOME/jobs (letters, digits, . _ -, no
    leading dot); UnknownJob otherwise. Ids come from a ledger others may write."""
    if not _SAFE_ID.match(job_id):
        raise UnknownJob(f"no job {job_id[:80]!r} in the ledger", hint="the jobs page lists them")
    return job_id


@dataclass(frozen=True)
class JobFilter:
    """The jobs page's filters: a state, an owner label, a part of the name (none: all)."""

    state: str | None = None
    owner: str | None = None
    name: str | None = None

    @classmethod
    def of(cls, query: Mapping[str, str]) -> JobFilter:
        """From a request's query: an unknown state is no filter; texts are cut to a bound."""

        def text(key: str) -> str | None:
            value = (query.get(key) or "").strip()[:FILTER_TEXT_LIMIT]
            return value or None

        state = text("state")
        return cls(
            state.upper() if state and state.upper() in STATES else None,
            text("owner"),
            text("name"),
        )

    @property
    def active(self) -> bool:
        return any((self.state, self.owner, self.name))

    def query(self) -> dict[str, str]:
        return {
            k: v
            for k, v in (("state", self.state), ("owner", self.owner), ("name", self.name))
            if v
        }


def _with_budgets(view: LedgerView, jobs: list[dict], now: datetime) -> list[dict]:
    specs = view.specs_of([job["id"] for job in jobs])
    for job in jobs:
        budget = budget_from_spec(specs.get(job["id"], "{}"))
        job["budget_usd"] = None if budget is None else float(budget)
        created = datetime.fromisoformat(job["created_at"]) if job.get("created_at") else None
        job["age_s"] = (now - created).total_seconds() if created else None
        job["final"] = JobState(job["state"]).is_final if job["state"] in STATES else True
    return jobs


def jobs_page(view: LedgerView, home: Path, now: datetime, filters: JobFilter) -> dict[str, Any]:
    """The jobs page: unfiltered, exactly `orch status`'s list (the newest 50 and every older
    unfinished job, in its order); filtered, the newest `FILTERED_LIMIT` matching jobs. Each
    job as `orch status --json` has it, with `budget_usd`, `age_s` and `final`; `hidden` counts
    those left out."""
    from orchestrator.report.documents import listed_jobs, status_list

    if filters.active:
        rows, matching = view.find_jobs(
            states=(filters.state,) if filters.state else (),
            owner=filters.owner,
            name_part=filters.name,
            limit=FILTERED_LIMIT,
        )
        jobs, hidden = listed_jobs(view, rows, home, now), max(0, matching - len(rows))
    else:
        jobs, hidden = status_list(view, home, now)
    return {
        "jobs": _with_budgets(view, jobs, now),
        "hidden": hidden,
        "owners": view.owners(),
        "states": STATES,
        "filter": filters,
    }


def job_page(view: LedgerView, settings: Settings, job_id: str, now: datetime) -> dict[str, Any]:
    """One job: `orch status JOB --json`'s document with its budget, the nodes whose logs this
    machine mirrors, and `version`, which changes whenever what the page draws changes."""
    from orchestrator.report.documents import job_document

    detail = view.job_detail(safe_job_id(job_id))
    document = job_document(view, settings, detail)
    budget = budget_from_spec(detail.spec_json)
    document["budget_usd"] = None if budget is None else float(budget)
    document["final"] = JobState(detail.state).is_final if detail.state in STATES else True
    logs = settings.job_dir(detail.id) / "logs"
    document["log_nodes"] = [
        rank
        for rank in range(min(detail.nodes, MAX_NODES))
        if (logs / f"node-{rank}.log").is_file()
    ]
    document["version"] = job_version(document)
    return document


def job_version(document: Mapping[str, Any]) -> str:
    """A short fingerprint of what a job's charts and tables show (its state, step, loss,
    events, checkpoints and newest GPU readings), not of the spend that grows every second."""
    marks = [
        document.get("state"),
        document.get("step"),
        document.get("loss"),
        len(document.get("events", [])),
        [c.get("step") for c in document.get("checkpoints", [])],
        [g.get("at") for g in document.get("gpus", [])],
    ]
    return hashlib.sha256(json.dumps(marks, default=str).encode()).hexdigest()[:16]


def chart_data(view: LedgerView, job_id: str, now: datetime) -> ReportData:
    """What `orch report` draws of a job, read through the view (UnknownJob if none)."""
    job = view.job_detail(safe_job_id(job_id))
    return build_report(
        job,  # type: ignore[arg-type]  # the view's rows carry the models' fields
        view.leases(job.id),  # type: ignore[arg-type]
        view.events(job.id),  # type: ignore[arg-type]
        view.gpu_samples(job.id),  # type: ignore[arg-type]
        now,
        view.progress_samples(job.id),  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class LogChunk:
    """A piece of a node's log as this machine mirrors it."""

    text: str
    offset: int  # where the next read starts
    size: int  # the file's size when read
    restarted: bool  # the file is shorter than the offset asked: rotated, read from its start


def log_chunk(settings: Settings, job_id: str, node: int, offset: int | None) -> LogChunk | None:
    """Up to `LOG_CHUNK_BYTES` of node `node`'s log of `job_id` from `offset` (None: its
    last `LOG_CHUNK_BYTES`); None when this machine holds no such log (another machine drives
    the job, or the node never wrote one)."""
    if not 0 <= node < MAX_NODES:
        return None
    path = settings.job_dir(safe_job_id(job_id)) / "logs" / f"node-{node}.log"
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            restarted = offset is not None and offset > size
            start = max(0, size - LOG_CHUNK_BYTES) if offset is None else 0 if restarted else offset
            handle.seek(start)
            data = handle.read(LOG_CHUNK_BYTES)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    if offset is None and start > 0:  # begin at a line's start
        cut = data.find(b"\n")
        data, start = (data[cut + 1 :], start + cut + 1) if cut >= 0 else (data, start)
    return LogChunk(data.decode("utf-8", "replace"), start + len(data), size, restarted)


def clusters_page(view: LedgerView, ledger: Any, home: Path, now: datetime) -> dict[str, Any]:
    """What runs where: every live job's billing nodes, kept clusters (up ones, then the newest
    20 ended), fleets with their machines, holders, queue and use, and this ORCH_HOME's
    controller host."""
    from orchestrator.control.verbs.fleets import fleet_document, fleet_status
    from orchestrator.host import record
    from orchestrator.report.clusters import clusters_from
    from orchestrator.report.documents import host_line

    clusters = clusters_from(view, view.clusters, now, up_only=False)
    up = [c for c in clusters if c["state"] == "UP"]
    ended = sorted(
        (c for c in clusters if c["state"] != "UP"),
        key=lambda c: c.get("ended_at") or "",
        reverse=True,
    )[:20]
    fleets = (
        [fleet_document(f) for f in fleet_status(ledger, None, now)] if view.has_fleets() else []
    )
    host = record.load(home)
    hosts = [host_line(h, now) for h in view.host_leases() if h.ended_at is None]
    live = view.live_jobs()
    leases = view.leases_of([job.id for job in live])
    nodes = [
        {
            "job": job.id,
            "job_name": job.name,
            "provider": job.provider,
            "rank": lease.rank,
            "instance_id": lease.instance_id,
            "instance_type": lease.instance_type,
            "market": lease.market,
            "price_per_hour": float(lease.price_per_hour),
            "up_s": (now - lease.launched_at).total_seconds(),
        }
        for job in live
        for lease in leases.get(job.id, [])
        if lease.ended_at is None
    ]
    return {
        "nodes": nodes,
        "clusters": up + ended,
        "fleets": fleets,
        "host": None
        if host is None
        else {
            "kind": host.kind,
            "address": f"{host.user}@{host.host}:{host.port}",
            "autostop_s": host.autostop_s,
            "version": host.version,
            "jobs": list(host.jobs),
            "price_per_hour": host.price_per_hour,
            "instance_id": host.instance_id,
        },
        "host_leases": hosts,
    }


def cost_page(view: LedgerView, settings: Settings, now: datetime) -> dict[str, Any]:
    """`orch cost` (the newest 50 jobs' rows, kept clusters, controller hosts, the total) with
    this month's spend per day and per owner label and the team's monthly budget
    (`budget.monthly_usd`) as it stands: the same spans the monthly caps count."""
    from orchestrator.control.money.team_budget import month_window
    from orchestrator.report.documents import cost_from
    from orchestrator.report.spending import burn_down, daily_spend, month_spans, spend_by_owner

    document = cost_from(view, view.clusters, now, limit=50)
    start, _ = month_window(now)
    spans = month_spans(view, now)
    owners = spend_by_owner(spans, start, now)
    burn = burn_down(spans, settings.budget.monthly_usd, now)
    document["month"] = f"{start:%Y-%m}"
    document["days"] = [
        {"day": d.day.isoformat(), "usd": float(d.usd)} for d in daily_spend(spans, start, now)
    ]
    document["owners"] = [
        {"owner": owner, "usd": float(usd)}
        for owner, usd in sorted(owners.items(), key=lambda item: (-item[1], item[0] or ""))
    ]
    document["budget"] = {
        "cap_usd": None if burn.cap_usd is None else float(burn.cap_usd),
        "spent_usd": float(burn.spent_usd),
        "hourly_usd": float(burn.hourly_usd),
        "projected_usd": float(burn.projected_usd),
        "runs_out_at": burn.runs_out_at.isoformat() if burn.runs_out_at else None,
    }
    return document
