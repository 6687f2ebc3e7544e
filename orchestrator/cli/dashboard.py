"""`orch dashboard`: serve the live web view of this ledger's jobs, GPUs, loss and money."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.output import make_console

DEFAULT_PORT = 8765


def dashboard_command(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="TCP port (0: any free one)")
    ] = DEFAULT_PORT,
    bind: Annotated[
        str,
        typer.Option(
            "--bind",
            metavar="ADDR",
            help="address to listen on; any but a loopback one requires the token",
        ),
    ] = "127.0.0.1",
    allow_actions: Annotated[
        bool,
        typer.Option(
            "--allow-actions",
            help="offer cancel (jobs this machine drives) and down (clusters it made) on the "
            "pages [read-only]",
        ),
    ] = False,
    new_token: Annotated[
        bool, typer.Option("--new-token", help="replace the token, so old links stop working")
    ] = False,
) -> None:
    """Serve a live web view of the ledger: jobs, a job's GPUs, loss, spend and logs,
    clusters and fleets, and what the month costs (a team's, on a shared ledger).

    Bound to 127.0.0.1 by default. On any other address every page needs the token, made once
    and kept 0600 in ORCH_HOME/dashboard-token: the printed address carries it. Read-only
    unless --allow-actions. Ctrl-C stops it."""
    from orchestrator.web.access import Access, is_loopback, load_token
    from orchestrator.web.app import Dashboard
    from orchestrator.web.server import bind_socket, serve

    settings = load_settings()
    ledger = open_ledger(settings)
    token = None if is_loopback(bind) else load_token(settings.home, renew=new_token)
    sock = bind_socket(bind, port)
    host, actual_port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{actual_port}/"
    console = make_console()

    def ready() -> None:
        say = lambda text: console.print(text, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
        say(f"dashboard: {url}")
        if token is not None:
            say(f"token: {token}")
            say(f"open: {url}?token={token}")
            say(
                f"every page needs the token (kept in {settings.home / 'dashboard-token'}); "
                "--new-token replaces it"
            )
        say(
            "cancel and down are offered"
            if allow_actions
            else "read-only: --allow-actions offers cancel and down"
        )
        say("Ctrl-C stops it")

    access = Access(bind, actual_port, token)
    serve(Dashboard(settings, ledger, access, allow_actions), sock, ready=ready)
    console.print("dashboard stopped", highlight=False, markup=False)
