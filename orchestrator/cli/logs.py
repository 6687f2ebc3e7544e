"""`orch logs JOB`: a job's node logs as mirrored by its controller, for people and programs
(`Jobs.logs`: this ledger's job, or the controller host's)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from orchestrator.cli.flags import duration
from orchestrator.cli.output import make_console


def since_time(text: str) -> datetime:
    """--since's value: a duration back from now (10m, 2h) or an ISO time (UTC unless it
    names its zone)."""
    try:
        return datetime.now(UTC) - timedelta(seconds=duration(text))
    except typer.BadParameter:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give a duration (10m, 2h) or an ISO time (2025-01-31T14:00:00Z)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def logs_command(
    job_id: Annotated[str, typer.Argument(help="job id")],
    rank: Annotated[int | None, typer.Option("--rank", help="only this global rank")] = None,
    node: Annotated[int | None, typer.Option("--node", help="this node's whole log")] = None,
    all_ranks: Annotated[
        bool,
        typer.Option("--all-ranks", help="every rank of every node, each line after its rank"),
    ] = False,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing")] = False,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="only the last N lines (then -f goes on)")
    ] = None,
    since: Annotated[
        datetime | None,
        typer.Option(
            "--since",
            parser=since_time,
            metavar="DURATION|TIME",
            help="only lines pulled since then: 10m ago, or an ISO time (UTC by default). "
            "Node lines carry no time; a line's time is when the controller pulled it, within "
            "one watch interval of its printing",
        ),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="one JSON object per line: node, rank, line, time (null: unknown)"
        ),
    ] = False,
) -> None:
    """Print a job's logs (rank 0 by default) as pulled from its nodes.

    The rotated files of a capped log (node-0.log.3 ... .1, settings `logs.*`) are read
    first, oldest first; -f follows the log across rotations."""
    from orchestrator.cli.on_host import jobs_for, passed_on
    from orchestrator.control.verbs.jobs import LogsRequest

    request = LogsRequest(job_id=job_id, rank=rank, node=node, all_ranks=all_ranks,
                          follow=follow, tail=tail, since=since, json_out=json_out)  # fmt: skip
    console = make_console(stderr=True)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def say(text: str, err: bool) -> None:
        console.print(text)

    with passed_on():
        code = jobs_for(job_id).logs(request, write, say)
    if code:
        raise typer.Exit(code)
