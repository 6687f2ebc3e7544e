"""`orch logs JOB`: a job's node logs as mirrored by its controller, for people and programs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import duration
from orchestrator.cli.output import make_console
from orchestrator.errors import SpecError
from orchestrator.job_state import JobState

if TYPE_CHECKING:
    from orchestrator.cluster.log_lines import LogLine

FOLLOW_POLL_S = 1.0
_NO_TIME = datetime.min.replace(tzinfo=UTC)


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


def _json_line(line: LogLine) -> str:
    return json.dumps(
        {
            "node": line.node,
            "rank": line.rank,
            "line": line.text,
            "time": line.at.isoformat() if line.at else None,
        }
    )


def _ranked(line: LogLine) -> str:
    who = f"rank {line.rank}" if line.rank is not None else f"node {line.node}"
    return f"[{who}] {line.text}"


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
    from orchestrator.cluster.log_lines import LogReader

    settings = load_settings()
    ledger = open_ledger(settings)
    job = ledger.get_job(job_id)
    if sum((rank is not None, node is not None, all_ranks)) > 1:
        raise SpecError("give one of --rank, --node and --all-ranks")
    ranks = job.nodes * job.gpus_per_node
    if rank is not None and not 0 <= rank < ranks:
        raise SpecError(f"--rank must be between 0 and {ranks - 1}")
    if node is not None and not 0 <= node < job.nodes:
        raise SpecError(f"--node must be between 0 and {job.nodes - 1}")
    # `launcher: none`: the run's own output carries no rank prefix: the node's whole log.
    whole = node is not None or json.loads(job.spec_json or "{}").get("launcher") == "none"
    wanted = rank or 0
    if all_ranks:
        nodes = list(range(job.nodes))
    else:
        nodes = [node if node is not None else wanted // job.gpus_per_node]
    logs = settings.job_dir(job.id) / "logs"
    readers = [LogReader(logs / f"node-{n}.log", n, job.gpus_per_node) for n in nodes]

    def keep(line: LogLine) -> bool:
        if since is not None and (line.at is None or line.at < since):
            return False
        return all_ranks or whole or line.rank == wanted

    render: Callable[[LogLine], str]
    if json_out:
        render = _json_line
    elif all_ranks:
        render = _ranked
    else:
        render = (lambda line: line.raw) if whole else (lambda line: line.text)
    first = True
    while True:
        done = not follow or JobState(ledger.get_job(job.id).state).is_final
        batch = [line for reader in readers for line in reader.read(final=done) if keep(line)]
        if len(readers) > 1:  # the nodes' lines in the order they were pulled
            batch.sort(key=lambda line: line.at or _NO_TIME)
        if first and tail is not None:
            batch = batch[-tail:] if tail else []
        first = False
        for line in batch:
            sys.stdout.write(render(line) + "\n")
        sys.stdout.flush()
        if done:
            break
        time.sleep(FOLLOW_POLL_S)
    if not any(reader.seen for reader in readers):
        which = "any node" if all_ranks else f"node {nodes[0]}"
        make_console(stderr=True).print(
            f"no log of {which} yet (logs arrive with the controller's next watch tick)"
        )
