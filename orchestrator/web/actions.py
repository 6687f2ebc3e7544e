"""Cancel and down from the dashboard, only when it was started with `--allow-actions`.

Each is a POST form that must carry the server's CSRF token and come from the dashboard's own
origin. It acts only on what this ORCH_HOME owns: a job whose controller lease this machine
holds (or, with no lease, whose owner label is this user's), a kept cluster this machine made.
What it does is exactly the command a user would type here, `orch cancel JOB` or
`orch down CLUSTER`, run in the background with its output kept under
ORCH_HOME/dashboard/actions/; the page follows the job's or cluster's state as it changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from orchestrator.job_state import JobState
from orchestrator.web.access import same
from orchestrator.web.pages import safe_job_id

if TYPE_CHECKING:
    from orchestrator.ledger.view import LedgerView
    from orchestrator.web.app import Dashboard

FORM_LIMIT = 4096  # bytes of a form's body read; a longer one is refused


async def _form(request: Request) -> dict[str, str]:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            return {}
    found = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
    return {key: values[0] for key, values in found.items() if values}


def job_is_ours(view: LedgerView, home_machine: str, owner_label: str, job_id: str) -> bool:
    """Whether this ORCH_HOME drives `job_id`: its controller lease is this machine's, or it
    has none and its owner label is this user's."""
    leases = view.fetch("SELECT machine FROM controller_lease WHERE job_id = ?", job_id)
    if leases:
        return str(leases[0][0]) == home_machine
    return view.get_job(job_id).owner == owner_label


def _run_in_background(dashboard: Dashboard, argv: list[str], name: str) -> None:
    """`orch ARGV` as this user runs it, its output in ORCH_HOME/dashboard/actions/NAME.log."""
    folder = dashboard.settings.home / "dashboard" / "actions"
    folder.mkdir(parents=True, exist_ok=True)
    log = (folder / f"{name}.log").open("ab")
    env = {**os.environ, "ORCH_HOME": str(dashboard.settings.home)}
    process = subprocess.Popen(  # noqa: S603 - our own CLI, arguments checked against the ledger
        [sys.executable, "-m", "orchestrator.cli", *argv],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    log.close()
    threading.Thread(target=process.wait, name=f"dashboard-{name}", daemon=True).start()


def action_routes(dashboard: Dashboard, page: Callable[..., Response]) -> list[Route]:
    """The POST routes of cancel and down."""
    access = dashboard.access
    home_machine = dashboard.home_machine

    def refused(request: Request, message: str, status: int = 403) -> Response:
        return page(
            request,
            "error.html",
            {"title": "Refused", "message": message, "hint": "reload the page and try again"},
            status,
        )

    async def checked(request: Request) -> str | None:
        """Why the form is refused, or None."""
        form = await _form(request)
        if not access.same_origin(request):
            return "the form did not come from this dashboard's pages"
        if not same(form.get("csrf"), access.csrf):
            return "the form's token is not this dashboard's (it was restarted?)"
        return None

    async def cancel(request: Request) -> Response:
        if (why := await checked(request)) is not None:
            return refused(request, why)
        job_id = safe_job_id(request.path_params["job_id"])
        with dashboard.view() as view:
            job = view.get_job(job_id)
            if JobState(job.state).is_final:
                return refused(request, f"job {job_id} already ended ({job.state})", 409)
            if not job_is_ours(view, home_machine, dashboard.settings.owner_label, job_id):
                return refused(
                    request,
                    f"job {job_id} is driven from another machine: its owner cancels it there",
                )
        _run_in_background(dashboard, ["cancel", job_id], f"cancel-{job_id}")
        return RedirectResponse(f"/jobs/{quote(job_id)}?asked=cancel", status_code=303)

    async def down(request: Request) -> Response:
        if (why := await checked(request)) is not None:
            return refused(request, why)
        name = request.path_params["name"]
        with dashboard.view() as view:
            found: Any = next((c for c in view.clusters.all(up_only=True) if c.name == name), None)
        if found is None:
            return refused(request, f"no kept cluster {name[:80]!r} is up", 404)
        if found.machine != home_machine:
            return refused(
                request,
                f"cluster {found.name} was made on another machine: its owner ends it there",
            )
        _run_in_background(dashboard, ["down", found.id], f"down-{found.id}")
        return RedirectResponse("/clusters?asked=down", status_code=303)

    return [
        Route("/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/clusters/{name}/down", down, methods=["POST"]),
    ]
