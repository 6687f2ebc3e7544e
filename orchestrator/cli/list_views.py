"""`orch status` and `orch cost`: the list views of the ledger's jobs (and of those a controller
host drives for this machine), and one job's detail. Without a job id they read the ledger's
read-only view when they can: no SQLModel, no configuration models, no SSH without a host."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import DURATION_METAVAR, JsonFlag, duration
from orchestrator.cli.kept import kept_clusters
from orchestrator.cli.output import make_console, print_json
from orchestrator.errors import SpecError

ALL_EVENTS = -1  # --events all


def event_rows(text: str) -> int:
    """`--events`: `all` (ALL_EVENTS), or a number of rows (1 or more)."""
    if text.strip().lower() == "all":
        return ALL_EVENTS
    try:
        rows = int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: `all` or a number of rows") from None
    if rows < 1:
        raise typer.BadParameter(f"{text!r}: `all` or a number of rows, 1 or more")
    return rows


if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.ledger.view import LedgerView


def page_limit(text: str) -> int:
    """`--limit`: a number of jobs, 1 or more."""
    try:
        count = int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: a number of jobs") from None
    if count < 1:
        raise typer.BadParameter(f"{text!r}: a number of jobs, 1 or more")
    return count


def since_time(text: str) -> datetime:
    """`--since`: `orch logs --since`'s times (a duration back from now, or an ISO time)."""
    from orchestrator.cli.logs import since_time as parse

    return parse(text)


LimitFlag = Annotated[
    int | None,
    typer.Option(
        "--limit", parser=page_limit, metavar="N", help="at most N jobs, the newest first"
    ),
]
SinceFlag = Annotated[
    datetime | None,
    typer.Option(
        "--since",
        parser=since_time,
        metavar="WHEN",
        help="only jobs created since WHEN: a duration back from now (10m, 2h, 7d) or an "
        "ISO time (UTC unless it names its zone)",
    ),
]


def status_command(
    job_id: Annotated[str | None, typer.Argument(help="a job id; all jobs when omitted")] = None,
    json_out: JsonFlag = False,
    watch: Annotated[bool, typer.Option("--watch", help="live view until the job ends")] = False,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            parser=duration,
            metavar=DURATION_METAVAR,
            help="time between --watch refreshes (2, 5s) [2s]",
        ),
    ] = None,
    events: Annotated[
        int | None,
        typer.Option(
            "--events",
            parser=event_rows,
            metavar="all|N",
            help="a job's events: all of them as recorded, or the newest N rows (repeats "
            "collapsed) and every state change before them [15]",
        ),
    ] = None,
    limit: LimitFlag = None,
    since: SinceFlag = None,
) -> None:
    """Show jobs, or one job with its leases, checkpoints and events (--watch: live).

    Without JOB_ID: the newest 50 jobs and every older unfinished one, and how many older
    finished jobs are not listed (`orch cost` lists every job).

    With JOB_ID: the job's recoveries, and its events with repeats collapsed (a run of
    CHECKPOINT events is one row): the newest 15 rows and every state change, recovery and
    move before them; a line counts the events left out (--events all: every event).

    --limit N / --since WHEN (a page, for scripts): the jobs created since WHEN, newest
    first, at most N, and no others."""
    if events is not None and (job_id is None or json_out or watch):
        raise SpecError(
            "--events goes with one job's view: `orch status JOB --events all`",
            hint="--json lists every event already",
        )
    if (limit is not None or since is not None) and (job_id is not None or watch):
        raise SpecError(
            "--limit and --since page the list of jobs: `orch status --limit 20 --json`",
            hint="`orch status JOB` shows one job",
        )
    page = _Page(limit, since)
    if job_id is None and not watch and interval is None and _status_from_view(json_out, page):
        return
    if _on_host(job_id, json_out=json_out, watch=watch, interval=interval, events=events):
        return
    from orchestrator.ledger.measures import utcnow
    from orchestrator.ledger.view import LedgerView
    from orchestrator.report.documents import status_list

    settings = load_settings()
    if job_id and not watch and interval is None:
        _print_job(settings, job_id, json_out, events)
        return
    ledger = open_ledger(settings)
    console = make_console()
    if watch or interval is not None:
        from orchestrator.cli.live import watch_command

        watch_command(
            settings, ledger, console, job_id, watch=watch, json_out=json_out, interval=interval
        )
        return
    with LedgerView.of_engine(ledger.engine) as view:  # rows, not a model object per job
        jobs, hidden = status_list(view, settings.home, utcnow(), limit=limit, since=since)
    _print_status(jobs, kept_clusters(settings, ledger), hidden, json_out, page)


def _print_job(settings: Settings, job_id: str, json_out: bool, events: int | None) -> None:
    """`orch status JOB`: its document (`job_document`) read through the ledger's read model,
    printed as JSON or as its detail with `events` rows of events."""
    from orchestrator.cli.console import RECENT_EVENTS, job_detail
    from orchestrator.cli.context import ledger_view
    from orchestrator.ledger.view import LedgerView
    from orchestrator.report.documents import job_document

    view = ledger_view() or LedgerView.of_engine(open_ledger(settings).engine)
    with view:
        document = job_document(view, settings, view.job_detail(job_id))
    if json_out:
        print_json(document)
        return
    console = make_console()
    rows = RECENT_EVENTS if events is None else None if events == ALL_EVENTS else events
    for renderable in job_detail(document, events=rows):
        console.print(renderable)


class _Page(NamedTuple):
    """`--limit` and `--since` of a list: a page for scripts when either is given."""

    limit: int | None
    since: datetime | None

    @property
    def paged(self) -> bool:
        return self.limit is not None or self.since is not None


def _print_status(
    jobs: list[dict], clusters: list[dict], hidden: int, json_out: bool, page: _Page
) -> None:
    """`orch status`'s list of jobs and kept clusters, and how many jobs it left out
    (`status_list`)."""
    jobs = _with_host_jobs(jobs, "status")
    if json_out:
        print_json({"jobs": jobs, "clusters": clusters})  # the document as it always was
        return
    from orchestrator.cli.console import clusters_table, jobs_table

    console = make_console()
    console.print(jobs_table(jobs))
    if hidden:
        console.print(
            f"{hidden} more job(s) not listed: raise --limit"
            if page.paged
            else f"{hidden} older finished job(s) not listed: `orch status JOB` shows one, "
            "`orch cost` lists every job",
            highlight=False,
            markup=False,
        )
    if clusters:
        console.print(clusters_table(clusters))


def _with_host_jobs(jobs: list[dict], command: str) -> list[dict]:
    """`jobs` and, when a controller host drives jobs submitted from here, its rows of them."""
    from orchestrator.cli.host_jobs import host_rows
    from orchestrator.host.listing import merged_jobs

    found = host_rows(command)
    return jobs if found is None else merged_jobs(jobs, *found)


def _status_from_view(json_out: bool, page: _Page) -> bool:
    """`orch status` of all jobs, read through the ledger's read-only view: the same documents
    without SQLModel or the configuration's models. False, with nothing printed, when the view
    does not apply (`ledger_view`) or a kept cluster is past its autostop: only its provider
    can say whether its guards ended it (`kept_clusters`)."""
    from orchestrator.cli.context import ledger_view, orch_home
    from orchestrator.ledger.measures import autostop_left, utcnow
    from orchestrator.report.clusters import clusters_from
    from orchestrator.report.documents import status_list

    view = ledger_view()
    if view is None:
        return False
    with view:
        now = utcnow()
        for cluster in view.clusters.all(up_only=True):
            left = autostop_left(cluster, now)
            if left is not None and left < 0:
                return False
        jobs, hidden = status_list(view, orch_home(), now, limit=page.limit, since=page.since)
        clusters = clusters_from(view, view.clusters, now, up_only=True)
    _print_status(jobs, clusters, hidden, json_out, page)
    return True


def cost_command(
    job_id: Annotated[str | None, typer.Option("--job", help="only this job")] = None,
    all_jobs: Annotated[
        bool, typer.Option("--all", help="a row for every job [the newest 50, and the rest summed]")
    ] = False,
    json_out: JsonFlag = False,
    limit: LimitFlag = None,
    since: SinceFlag = None,
) -> None:
    """What jobs cost: node-seconds x the price recorded at launch. The table has a row for
    each of the newest 50 jobs and one summing the older ones (--all: a row each); --json
    lists every job.

    --limit N / --since WHEN (a page, for scripts): rows of the jobs created since WHEN,
    newest first, at most N; the kept clusters, controller hosts and total stay the whole
    ledger's."""
    if (limit is not None or since is not None) and job_id is not None:
        raise SpecError(
            "--limit and --since page the list of jobs; --job shows one",
            hint="`orch cost --since 7d --json` lists the jobs of the last week",
        )
    from orchestrator.cli.context import ledger_view, orch_home
    from orchestrator.cli.host_billing import settle_recorded
    from orchestrator.cli.host_jobs import host_rows
    from orchestrator.cli.on_host import jobs_for, lives_on_host, passed_on
    from orchestrator.ledger.measures import utcnow
    from orchestrator.report.documents import cost_from

    if lives_on_host(job_id):  # its bill is the host's
        with passed_on():
            document = jobs_for(job_id).cost(str(job_id))
        _print_cost(document, json_out=json_out, all_jobs=all_jobs)
        return
    settle_recorded(orch_home())  # a controller host that powered itself off stopped billing
    view = ledger_view()  # the ledger's read-only view: no SQLModel, no configuration models
    if view is None:  # a ledger to migrate first, or one that does not answer: rows still
        from orchestrator.ledger.view import LedgerView

        view = LedgerView.of_engine(open_ledger(load_settings()).engine)
    with view:
        document = cost_from(view, view.clusters, utcnow(), job_id, limit=limit, since=since)
        if job_id is not None:
            document["spot_auto"] = _spot_auto(view, job_id)
        fleets = job_id is None and view.has_fleets()
    if fleets:  # owned machines: the share of the month its jobs held each fleet
        from orchestrator.control.money.team_budget import month_window
        from orchestrator.control.verbs.fleets import fleet_costs

        now = utcnow()
        document["fleets"] = fleet_costs(open_ledger(load_settings()), month_window(now)[0], now)
    if job_id is None and (found := host_rows("cost")) is not None:
        from orchestrator.host.listing import merged_jobs, merged_total

        document["total_usd"] = merged_total(document["total_usd"], found[0], found[1])
        document["jobs"] = merged_jobs(document["jobs"], *found)
    _print_cost(document, json_out=json_out, all_jobs=all_jobs)


def _print_cost(document: dict, *, json_out: bool, all_jobs: bool) -> None:
    if json_out:
        print_json(document)
    else:
        from orchestrator.cli.console import COST_ROWS, cost_table

        make_console().print(cost_table(document, limit=None if all_jobs else COST_ROWS))
        for fleet in document.get("fleets", []):
            make_console().print(
                f"fleet {fleet['name']}: {fleet['held_hours']:.1f} of {fleet['host_hours']:.1f} "
                f"host-hours held by jobs this month ({fleet['utilization']:.0%}), "
                f"{fleet['idle_hours']:.1f} idle",
                markup=False,
                highlight=False,
            )
        if document.get("spot_auto"):
            make_console().print(document["spot_auto"]["line"], markup=False, highlight=False)


def _on_host(
    job_id: str | None, *, json_out: bool, watch: bool, interval: float | None, events: int | None
) -> bool:
    """`orch status JOB` of a job that lives on the controller host, shown (`cli.on_host`);
    False for any other."""
    from orchestrator.cli.on_host import describe_on_host, lives_on_host, watch_on_host

    if not lives_on_host(job_id):
        return False
    assert job_id is not None
    if watch:
        argv = ["status", job_id, "--watch", *(["--json"] if json_out else [])]
        argv += ["--interval", str(interval)] if interval is not None else []
        raise typer.Exit(watch_on_host(argv))
    from orchestrator.cli.console import RECENT_EVENTS

    rows = RECENT_EVENTS if events is None else None if events == ALL_EVENTS else events
    describe_on_host(job_id, json_out=json_out, events=rows)
    return True


def _spot_auto(view: LedgerView, job_id: str) -> dict | None:
    """`report.spot_choice.spot_auto_of` of one job, with this machine's local price."""
    from orchestrator.report.spot_choice import spot_auto_of

    return spot_auto_of(view, job_id, lambda: load_settings().local.price_per_hour)
