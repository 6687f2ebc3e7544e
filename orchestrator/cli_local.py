"""`orch local ...`: rehearse what a cloud does to spot nodes, on the local provider."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console

from orchestrator.config import Settings, load_settings
from orchestrator.errors import OrchError, SpecError
from orchestrator.ledger import JobState, Ledger, make_engine
from orchestrator.providers.base import Instance
from orchestrator.providers.local import LocalProvider

app = typer.Typer(
    name="local",
    help="Rehearse spot behaviour on local nodes: reclaims with notice, spot capacity.",
    no_args_is_help=True,
)


def _job_nodes(settings: Settings, job_id: str) -> list[Instance]:
    ledger = Ledger(make_engine(settings.db_path))
    job = ledger.get_job(job_id)
    if job.provider != "local":
        raise SpecError(f"job {job_id} runs on {job.provider}; `orch local` acts on local nodes")
    return sorted(LocalProvider(settings).list_owned(job_id=job_id), key=lambda i: i.rank)


def _pick(nodes: list[Instance], rank: int | None, any_market: bool, job_id: str) -> Instance:
    if not nodes:
        raise OrchError(f"job {job_id} has no running node now", hint="see `orch status`")
    if rank is None:
        node = nodes[-1]
    else:
        found = [n for n in nodes if n.rank == rank]
        if not found:
            ranks = ", ".join(str(n.rank) for n in nodes)
            raise SpecError(f"job {job_id} has no node {rank}", hint=f"its nodes: {ranks}")
        node = found[0]
    if node.market != "spot" and not any_market:
        raise SpecError(
            f"node {node.rank} ({node.instance_id}) is on-demand; only spot nodes are reclaimed",
            hint="--any-market takes it anyway",
        )
    return node


@app.command()
def preempt(
    job_id: Annotated[str, typer.Argument(help="job id")],
    node: Annotated[
        int | None, typer.Option("--node", help="node rank (default: the last)")
    ] = None,
    notice: Annotated[
        float, typer.Option("--notice", min=0, help="seconds of notice before the reclaim")
    ] = 0.0,
    any_market: Annotated[
        bool, typer.Option("--any-market", help="reclaim an on-demand node too")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Reclaim one node of a job like a spot reclaim does.

    With --notice S, its metadata endpoint posts an interruption notice for S seconds first;
    then the node's link goes down and every process of it is killed at once.
    """
    settings = load_settings()
    target = _pick(_job_nodes(settings, job_id), node, any_market, job_id)
    console = Console(stderr=json_out)
    posted = datetime.now(UTC)
    if notice:
        console.print(
            f"notice posted on node {target.rank} ({target.instance_id}); reclaim in {notice:g} s"
        )
    taken = LocalProvider(settings).reclaim(target.instance_id, notice)
    if json_out:
        document = {
            "job": job_id, "node": target.rank, "instance_id": target.instance_id,
            "notice_s": notice, "notice_posted_at": posted.isoformat(),
            "reclaimed_at": taken.isoformat() if taken else None,
        }  # fmt: skip
        sys.stdout.write(json.dumps(document) + "\n")
    elif taken is None:
        console.print(f"node {target.rank} ({target.instance_id}) was let go by its job first")
    else:
        console.print(f"node {target.rank} ({target.instance_id}) reclaimed at {taken:%H:%M:%S}")


@app.command()
def chaos(
    job_id: Annotated[str, typer.Argument(help="job id")],
    seed: Annotated[int, typer.Option("--seed", help="same seed, same reclaims")] = 0,
    rate: Annotated[
        float, typer.Option("--rate", min=0.001, help="mean reclaims per minute of running")
    ] = 1.0,
    count: Annotated[int, typer.Option("--count", min=1, help="stop after this many")] = 5,
    notice: Annotated[float, typer.Option("--notice", min=0, help="seconds of notice")] = 0.0,
) -> None:
    """Reclaim random spot nodes of a running job at random times (seeded), for soak tests.

    Waits are drawn from an exponential distribution and counted while the job is RUNNING;
    stops after --count reclaims or when the job ends.
    """
    from orchestrator.chaos import ReclaimDraws

    settings = load_settings()
    ledger = Ledger(make_engine(settings.db_path))
    provider = LocalProvider(settings)
    draws = ReclaimDraws(seed, rate)
    console = Console()
    done = 0
    for wait in draws.waits():
        if done >= count:
            break
        waited = 0.0
        while waited < wait:
            state = JobState(ledger.get_job(job_id).state)
            if state.is_final:
                console.print(f"job {job_id} ended ({state.value}) after {done} reclaim(s)")
                return
            time.sleep(0.2)
            if state is JobState.RUNNING:
                waited += 0.2
        job = ledger.get_job(job_id)
        leased = {lease.instance_id for lease in ledger.leases(job_id, open_only=True)}
        spot = [
            n
            for n in _job_nodes(settings, job_id)
            if n.market == "spot" and n.instance_id in leased
        ]
        if not spot or JobState(job.state) is not JobState.RUNNING:
            continue
        target = draws.pick(spot)
        try:
            taken = provider.reclaim(target.instance_id, notice)
        except OrchError as exc:  # the node went meanwhile (the job recovered or ended)
            console.print(f"skipped node {target.rank}: {exc.message}")
            continue
        if taken is None:
            console.print(f"skipped node {target.rank}: its job let it go first")
            continue
        done += 1
        console.print(f"reclaim {done}/{count}: node {target.rank} ({target.instance_id})")
        # One reclaim per run: the next wait starts once the job has taken this one in.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            now = ledger.get_job(job_id)
            if now.recoveries > job.recoveries or JobState(now.state).is_final:
                break
            time.sleep(0.2)
    console.print(f"done: {done} reclaim(s) of job {job_id}")


@app.command()
def spot(
    state: Annotated[str, typer.Argument(help="on: grant spot launches; off: refuse them")],
) -> None:
    """Grant or refuse spot launches of local nodes (a rehearsal of missing spot capacity)."""
    if state not in ("on", "off"):
        raise SpecError(f"expected on or off, not {state!r}")
    LocalProvider(load_settings()).set_spot_available(state == "on")
    Console().print(f"local spot capacity: {'granted' if state == 'on' else 'refused'}")
