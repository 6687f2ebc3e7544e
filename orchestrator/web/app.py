"""The dashboard's web app: pages, their live parts, charts and (with `allow_actions`) the
cancel and down forms, over one ledger.

Every request reads the ledger through a `LedgerView` of its own (one snapshot, closed at the
end of the request). Nothing here changes the ledger: cancel and down run `orch cancel JOB`
and `orch down CLUSTER` as this ORCH_HOME's user would (`actions.py`), and exist only when the
server was started with `--allow-actions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from orchestrator.config import Settings
from orchestrator.errors import OrchError, UnknownJob
from orchestrator.ledger.database import LedgerUnreachable
from orchestrator.ledger.store import Ledger
from orchestrator.ledger.view import LedgerView
from orchestrator.report.panels import PANELS
from orchestrator.web import pages
from orchestrator.web.access import Access, AccessMiddleware
from orchestrator.web.formatting import install_filters

HERE = Path(__file__).parent
JOB_PANELS = PANELS  # the charts of a job: `orch report`'s panels
COST_CHARTS = ("daily", "burndown")
LIVE_POLL_MS = 2000  # how often a page asks for what changed (the bound: 5 s)


@dataclass(frozen=True)
class Dashboard:
    """What one server serves: the settings of its ORCH_HOME, its ledger, its access rules,
    whether it offers cancel and down, and the clock (tests pass one)."""

    settings: Settings
    ledger: Ledger
    access: Access
    allow_actions: bool = False
    now: Callable[[], datetime] | None = None

    def clock(self) -> datetime:
        from orchestrator.ledger.measures import utcnow

        return self.now() if self.now else utcnow()

    @cached_property
    def home_machine(self) -> str:
        """The machine id of this ORCH_HOME: what owns its jobs' controller leases (read once,
        not at every request)."""
        from orchestrator.control.process.machine_id import machine_id

        return machine_id(self.settings.home)

    @contextmanager
    def view(self) -> Iterator[LedgerView]:
        try:
            view = LedgerView.of_engine(self.ledger.engine)
        except Exception as exc:  # noqa: BLE001 - any driver error: the database is away
            raise LedgerUnreachable(
                f"the ledger does not answer: {type(exc).__name__}",
                hint="the page tries again by itself; check the database `ledger.url` names",
            ) from exc
        with view:
            yield view


def create_app(dashboard: Dashboard) -> Starlette:
    """The ASGI app of `dashboard`, with its access rules applied to every request."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    install_filters(templates.env)
    templates.env.globals.update(
        allow_actions=dashboard.allow_actions,
        csrf=dashboard.access.csrf,
        poll_ms=LIVE_POLL_MS,
        owner_label=dashboard.settings.owner_label,
    )

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=status)

    def fragment(name: str, context: dict[str, Any]) -> str:
        return templates.get_template(name).render(**context)

    def jobs(request: Request) -> Response:
        filters = pages.JobFilter.of(request.query_params)
        with dashboard.view() as view:
            data = pages.jobs_page(view, dashboard.settings.home, dashboard.clock(), filters)
        if request.query_params.get("part") == "rows":
            return HTMLResponse(fragment("_job_rows.html", data))
        return page(request, "jobs.html", {**data, "nav": "jobs"})

    def jobs_json(request: Request) -> Response:
        filters = pages.JobFilter.of(request.query_params)
        with dashboard.view() as view:
            data = pages.jobs_page(view, dashboard.settings.home, dashboard.clock(), filters)
        return JSONResponse({"jobs": data["jobs"], "hidden": data["hidden"]})

    def job(request: Request) -> Response:
        with dashboard.view() as view:
            data = pages.job_page(
                view, dashboard.settings, request.path_params["job_id"], dashboard.clock()
            )
            if dashboard.allow_actions:
                from orchestrator.web.actions import job_is_ours

                data["ours"] = job_is_ours(view, dashboard.home_machine,
                                           dashboard.settings.owner_label, data["id"])  # fmt: skip
        return page(request, "job.html", {"job": data, "panels": JOB_PANELS, "nav": "jobs"})

    def job_json(request: Request) -> Response:
        with dashboard.view() as view:
            data = pages.job_page(
                view, dashboard.settings, request.path_params["job_id"], dashboard.clock()
            )
        return JSONResponse(data)

    def job_live(request: Request) -> Response:
        """What a job's open page replaces: its version, state and rendered parts."""
        with dashboard.view() as view:
            data = pages.job_page(
                view, dashboard.settings, request.path_params["job_id"], dashboard.clock()
            )
        context = {"job": data}
        return JSONResponse(
            {
                "version": data["version"],
                "state": data["state"],
                "final": data["final"],
                "parts": {
                    part: fragment(f"_job_{part}.html", context)
                    for part in ("summary", "events", "checkpoints")
                },
            }
        )

    def job_chart(request: Request) -> Response:
        panel = request.path_params["panel"]
        if panel not in JOB_PANELS:
            raise HTTPException(404, f"no chart {panel[:40]!r}: {', '.join(JOB_PANELS)}")
        from orchestrator.report.panels import render_panel_svg

        with dashboard.view() as view:
            data = pages.chart_data(view, request.path_params["job_id"], dashboard.clock())
        return _svg(render_panel_svg(data, panel), versioned="v" in request.query_params)

    def job_log(request: Request) -> Response:
        node = _int(request.query_params.get("node"), 0)
        offset = request.query_params.get("offset")
        with dashboard.view() as view:  # the job must be in the ledger
            view.get_job(pages.safe_job_id(request.path_params["job_id"]))
        chunk = pages.log_chunk(
            dashboard.settings,
            request.path_params["job_id"],
            node,
            None if offset is None else max(0, _int(offset, 0)),
        )
        if chunk is None:
            return JSONResponse({"available": False, "text": "", "offset": 0})
        return JSONResponse(
            {
                "available": True,
                "text": chunk.text,
                "offset": chunk.offset,
                "size": chunk.size,
                "restarted": chunk.restarted,
            }
        )

    def clusters(request: Request) -> Response:
        with dashboard.view() as view:
            data = pages.clusters_page(
                view, dashboard.ledger, dashboard.settings.home, dashboard.clock()
            )
            machine = dashboard.home_machine if dashboard.allow_actions else None
            ours = {c.id for c in view.clusters.all(up_only=True) if c.machine == machine}
        return page(request, "clusters.html", {**data, "ours": ours, "nav": "clusters"})

    def cost(request: Request) -> Response:
        with dashboard.view() as view:
            data = pages.cost_page(view, dashboard.settings, dashboard.clock())
        return page(request, "cost.html", {"cost": data, "nav": "cost"})

    def cost_chart(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in COST_CHARTS:
            raise HTTPException(404, f"no chart {name[:40]!r}: {', '.join(COST_CHARTS)}")
        from orchestrator.control.money.team_budget import month_window
        from orchestrator.report import spending

        now = dashboard.clock()
        with dashboard.view() as view:
            spans = spending.month_spans(view, now)
        if name == "daily":
            svg = spending.render_daily_svg(spending.daily_spend(spans, month_window(now)[0], now))
        else:
            burn = spending.burn_down(spans, dashboard.settings.budget.monthly_usd, now)
            svg = spending.render_burn_down_svg(burn)
        return _svg(svg, versioned=False)

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    def favicon(request: Request) -> Response:  # asked by browsers whatever the page names
        return RedirectResponse("/static/favicon.svg", status_code=301)

    routes = [
        Route("/", jobs),
        Route("/healthz", healthz),
        Route("/favicon.ico", favicon),
        Route("/jobs/{job_id}", job),
        Route("/jobs/{job_id}/live", job_live),
        Route("/jobs/{job_id}/log", job_log),
        Route("/jobs/{job_id}/charts/{panel}.svg", job_chart),
        Route("/clusters", clusters),
        Route("/cost", cost),
        Route("/cost/charts/{name}.svg", cost_chart),
        Route("/api/jobs", jobs_json),
        Route("/api/jobs/{job_id}", job_json),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if dashboard.allow_actions:
        from orchestrator.web.actions import action_routes

        routes += action_routes(dashboard, page)

    async def not_found(request: Request, exc: Exception) -> Response:
        detail = getattr(exc, "detail", None) or str(exc)
        return page(
            request,
            "error.html",
            {"title": "Not found", "message": detail, "hint": "the jobs page lists what there is"},
            404,
        )

    async def orch_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OrchError)
        status = (
            404
            if isinstance(exc, UnknownJob)
            else 503
            if isinstance(exc, LedgerUnreachable)
            else 500
        )
        path = request.url.path
        if path.startswith("/api/") or path.endswith(("/live", "/log")):
            return JSONResponse({"error": exc.message, "hint": exc.hint}, status_code=status)
        return page(
            request,
            "error.html",
            {
                "title": "Not found" if status == 404 else "Error",
                "message": exc.message,
                "hint": exc.hint,
            },
            status,
        )

    app = Starlette(routes=routes, exception_handlers={404: not_found, OrchError: orch_error})
    app.add_middleware(AccessMiddleware, access=dashboard.access)
    return app


def _svg(content: bytes, *, versioned: bool) -> Response:
    # A chart asked with its page's version (`?v=`) is the same until the version changes.
    cache = "private, max-age=600" if versioned else "no-store"
    return Response(content, media_type="image/svg+xml", headers={"Cache-Control": cache})


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
