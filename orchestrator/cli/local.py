"""`orch local ...`: rehearse what a cloud does to spot nodes, on the local provider."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import DURATION_METAVAR, duration
from orchestrator.cli.output import make_console
from orchestrator.errors import OrchError, SpecError
from orchestrator.job_state import JobState

if TYPE_CHECKING:  # imported when a command runs: building the app (`orch --help`) needs none
    from orchestrator.config import Settings
    from orchestrator.providers.base import Instance
    from orchestrator.providers.local.provider import LocalProvider
    from orchestrator.providers.traces import TraceClock

app = typer.Typer(
    name="local",
    help="Rehearse spot behaviour on local nodes: reclaims with notice, spot capacity, traces.",
    no_args_is_help=True,
)


def _provider(settings: Settings) -> LocalProvider:
    from orchestrator.providers.local.provider import LocalProvider

    return LocalProvider(settings)


def _job_nodes(settings: Settings, job_id: str) -> list[Instance]:
    ledger = open_ledger(settings)
    job = ledger.get_job(job_id)
    if job.provider != "local":
        raise SpecError(f"job {job_id} runs on {job.provider}; `orch local` acts on local nodes")
    return sorted(_provider(settings).list_owned(job_id=job.node_owner), key=lambda i: i.rank)


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
        float,
        typer.Option(
            "--notice",
            parser=duration,
            metavar=DURATION_METAVAR,
            help="notice before the reclaim (30, 30s, 2m)",
        ),
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
    console = make_console(stderr=json_out)
    posted = datetime.now(UTC)
    if notice:
        console.print(
            f"notice posted on node {target.rank} ({target.instance_id}); reclaim in {notice:g} s"
        )
    taken = _provider(settings).reclaim(target.instance_id, notice)
    if json_out:
        document = {
            "job": job_id, "node": target.rank, "instance_id": target.instance_id,
            "notice_s": notice, "notice_posted_at": posted.isoformat(),
            "reclaimed_at": taken.isoformat() if taken else None,
        }  # fmt: skip
        sys.stdout.write(json.dumps(document) + "\n")
    elif taken is None:
        console.print(
            f"node {target.rank} ({target.instance_id}) was not reclaimed: orch ended it "
            f"during the {notice:g} s notice (a job that sees a notice saves a checkpoint and "
            "ends the node itself), so nothing was left to take; "
            f"`orch status {job_id}` shows what the job did",
            highlight=False,
        )
    else:
        console.print(f"node {target.rank} ({target.instance_id}) reclaimed at {taken:%H:%M:%S}")


@app.command()
def chaos(
    job_id: Annotated[str, typer.Argument(help="job id")],
    seed: Annotated[int, typer.Option("--seed", help="same seed, same reclaims")] = 0,
    rate: Annotated[
        float | None,
        typer.Option("--rate", min=0.001, help="mean reclaims per minute of running [1]"),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, help="stop after this many [--rate: 5; trace: no limit]"),
    ] = None,
    notice: Annotated[
        float,
        typer.Option(
            "--notice", parser=duration, metavar=DURATION_METAVAR, help="notice before each reclaim"
        ),
    ] = 0.0,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="follow this availability trace instead of a rate"),
    ] = None,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="--trace: trace seconds per wall second")
    ] = 1.0,
    start_tick: Annotated[
        int, typer.Option("--start-tick", min=0, help="--trace: the tick to start at")
    ] = 0,
    follow_trace: Annotated[
        bool,
        typer.Option(
            "--follow-trace", help="follow the spot capacity `orch local spot` set (a trace)"
        ),
    ] = False,
) -> None:
    """Reclaim spot nodes of a running job, for soak tests: at random times (seeded), or
    whenever an availability trace stops granting them.

    --rate: waits are drawn from an exponential distribution and counted while the job is
    RUNNING; stops after --count reclaims (5) or when the job ends. --trace FILE: replays the
    trace as `orch local spot --trace` does (spot launches are refused while it says 0), and
    whenever it grants fewer spot instances than the job holds, the excess nodes are reclaimed
    (highest ranks first); --follow-trace does the same with the spot capacity already set,
    read afresh as it goes (a trace, or `orch local spot off`: every spot node). Runs until
    the job ends.
    """
    settings = load_settings()
    provider = _provider(settings)
    if trace is not None or follow_trace:
        if rate is not None:
            raise SpecError("--rate and --trace exclude each other", hint="give one of them")
        if trace is not None and follow_trace:
            raise SpecError("--trace and --follow-trace exclude each other")
        if trace is not None:
            _start_trace(provider, trace, time_scale, start_tick)
        _reclaim_by_capacity(settings, provider, job_id, notice, count)
        return
    _reclaim_at_random(settings, provider, job_id, seed, rate or 1.0, count or 5, notice)


def _reclaim_at_random(
    settings: Settings,
    provider: LocalProvider,
    job_id: str,
    seed: int,
    rate: float,
    count: int,
    notice: float,
) -> None:
    from orchestrator.providers.local.chaos import ReclaimDraws

    ledger = open_ledger(settings)
    draws = ReclaimDraws(seed, rate)
    console = make_console()
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


def _reclaim_by_capacity(
    settings: Settings,
    provider: LocalProvider,
    job_id: str,
    notice: float,
    count: int | None,
) -> None:
    """Take back the job's spot nodes that the local spot capacity (a trace replayed, or
    `orch local spot on|off`) no longer grants, read afresh every 0.2 s, until the job ends."""
    from orchestrator.providers.local.chaos import excess_spot_nodes

    _job_nodes(settings, job_id)  # a local job that exists
    ledger = open_ledger(settings)
    console = make_console()
    in_notice: set[str] = set()
    lock = threading.Lock()
    done = 0

    def take(node: Instance, clock: TraceClock | None) -> None:
        nonlocal done
        try:
            taken = provider.reclaim(node.instance_id, notice)
        except OrchError as exc:  # ended by its job meanwhile
            console.print(f"skipped node {node.rank}: {exc.message}")
            taken = None
        with lock:
            in_notice.discard(node.instance_id)
            if taken is not None:
                done += 1
                tick = f", trace tick {clock.tick_at(taken)}" if clock is not None else ""
                console.print(
                    f"reclaim {done}: node {node.rank} ({node.instance_id}) at "
                    f"{taken:%H:%M:%S}{tick}"
                )

    while True:
        state = JobState(ledger.get_job(job_id).state)
        if state.is_final or (count is not None and done >= count):
            break
        capacity = provider.spot_capacity()
        with lock:
            held = [
                node
                for node in sorted(provider.list_owned(job_id=job_id), key=lambda n: n.rank)
                if node.market == "spot" and node.instance_id not in in_notice
            ]
            granted = capacity.spot_count(datetime.now(UTC))
            if granted is None:
                granted = len(held) if capacity.available else 0
            targets = excess_spot_nodes(held, granted)
            in_notice.update(node.instance_id for node in targets)
        for node in targets:
            threading.Thread(target=take, args=(node, capacity.clock), daemon=True).start()
        time.sleep(0.2)
    console.print(f"done: {done} reclaim(s) of job {job_id}")


def _start_trace(
    provider: LocalProvider, path: Path, time_scale: float, start_tick: int
) -> TraceClock:
    """Load a trace file and make local spot capacity follow it from now on."""
    if not math.isfinite(time_scale) or time_scale <= 0:
        raise SpecError(f"--time-scale must be a positive number, got {time_scale}")
    from orchestrator.providers.traces import load_trace

    loaded = load_trace(path)
    if start_tick >= len(loaded):
        raise SpecError(
            f"--start-tick {start_tick} is past the end of {loaded.name} ({len(loaded)} ticks)"
        )
    return provider.follow_trace(loaded, time_scale=time_scale, start_tick=start_tick)


@app.command()
def spot(
    state: Annotated[
        str | None,
        typer.Argument(help="on: grant spot launches; off: refuse them; nothing: show"),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="grant spot launches as this availability trace says"),
    ] = None,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="trace seconds per wall second (e.g. 60)")
    ] = 1.0,
    start_tick: Annotated[
        int, typer.Option("--start-tick", min=0, help="the trace tick in force now")
    ] = 0,
) -> None:
    """Grant or refuse spot launches of local nodes (a rehearsal of missing spot capacity).

    With --trace FILE, spot launches follow a spot availability trace (the format of
    `orch simulate`) replayed from now on, --time-scale times faster than wall time, starting
    at --start-tick: a launch of N spot nodes is refused while the trace's value is below N.
    `on` or `off` ends the replay.
    """
    provider = _provider(load_settings())
    console = make_console()
    if trace is not None:
        if state is not None:
            raise SpecError(f"give on, off or --trace, not both {state!r} and --trace")
        clock = _start_trace(provider, trace, time_scale, start_tick)
        gap = clock.trace.gap_s / clock.time_scale
        console.print(
            f"local spot capacity follows {clock.trace.name}: {len(clock.trace)} ticks of "
            f"{gap:g} s from tick {start_tick}; now {clock.spot_count(datetime.now(UTC))} spot"
        )
        return
    if state is None:
        capacity = provider.spot_capacity()
        now = datetime.now(UTC)
        if capacity.clock is not None:
            console.print(
                f"local spot capacity follows {capacity.clock.trace.name}: tick "
                f"{capacity.clock.tick_at(now)} of {len(capacity.clock.trace)}, "
                f"{capacity.spot_count(now)} spot now"
            )
        else:
            console.print(f"local spot capacity: {'granted' if capacity.available else 'refused'}")
        return
    if state not in ("on", "off"):
        raise SpecError(f"expected on or off, not {state!r}")
    provider.set_spot_available(state == "on")
    console.print(f"local spot capacity: {'granted' if state == 'on' else 'refused'}")
