"""`orch simulate`: what each spot policy would cost on an availability trace.

    orch simulate --trace FILE --job-hours H --deadline-hours D --overhead-minutes M
                  [--policy NAME ...] [--price-ratio R] [--json]
    orch simulate --sweep --trace FILE [--trace FILE ...] --job-hours H [--job-hours H ...]
                  --overhead-minutes M --out-dir DIR
    orch simulate --zones --trace A --trace B [--trace C ...] --migration-minutes M
                  [--zone-price P ...] ...  (the traces as zones over one span of time; with
                  --sweep, the multi-zone section of DIR/spot-deadlines.md)

Bad flags and bad trace files exit 2. Registered on the app by `orchestrator.cli.app`.
"""

from __future__ import annotations

import json
import math
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from orchestrator.cli.output import make_console
from orchestrator.errors import SpecError

if TYPE_CHECKING:  # the simulator is imported when the command runs, not when the app is built
    from orchestrator.spot.simulate import Prices
    from orchestrator.spot.zones import Zones

__all__ = ["simulate_command"]

_NUMBER_HELP = "a positive number, e.g. 0.33 or 1/3"


def _positive_decimal(text: str, flag: str) -> Decimal:
    """`text` as a positive Decimal; "a/b" is a fraction. SpecError naming `flag` otherwise."""
    try:
        if "/" in text:
            numerator, denominator = text.split("/", 1)
            value = Decimal(numerator.strip()) / Decimal(denominator.strip())
        else:
            value = Decimal(text.strip())
    except (InvalidOperation, ZeroDivisionError, ValueError):
        raise SpecError(f"{flag} {text!r} is not a number", hint=f"give {_NUMBER_HELP}") from None
    if not value.is_finite() or value <= 0:
        raise SpecError(f"{flag} must be positive, got {text!r}", hint=f"give {_NUMBER_HELP}")
    return value


def _check_hours(value: float, flag: str, *, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise SpecError(f"{flag} must be a number {bound}, got {value}")


def simulate_command(
    trace: Annotated[
        list[Path],
        typer.Option("--trace", help="availability trace (JSON); repeat for a sweep"),
    ],
    job_hours: Annotated[
        list[float],
        typer.Option("--job-hours", help="hours of compute the job needs; repeat for a sweep"),
    ],
    overhead_minutes: Annotated[
        float,
        typer.Option("--overhead-minutes", help="minutes lost on every (re)start"),
    ],
    deadline_hours: Annotated[
        float | None,
        typer.Option("--deadline-hours", help="deadline, hours after submit (not with --sweep)"),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            help="uniform-progress, greedy, on-demand, spot-only, optimal (the offline "
            "optimum); with --zones their -mz forms and optimal (with --zones --sweep, the "
            "plain names: each runs over the zones and in each zone); repeat",
        ),
    ] = None,
    price_ratio: Annotated[
        str, typer.Option("--price-ratio", help="spot price / on-demand price")
    ] = "1/3",
    on_demand_price: Annotated[
        str, typer.Option("--on-demand-price", help="USD per node-hour (p3.2xlarge us-east-1)")
    ] = "3.06",
    spot_price: Annotated[
        str | None,
        typer.Option("--spot-price", help="USD per node-hour; overrides --price-ratio"),
    ] = None,
    nodes: Annotated[
        int, typer.Option("--nodes", min=1, help="nodes the job needs (spot for all, or none)")
    ] = 1,
    start_hour: Annotated[
        float, typer.Option("--start-hour", help="submit this many hours into the trace")
    ] = 0.0,
    sweep: Annotated[
        bool,
        typer.Option("--sweep", help="sweep deadline slack 10-100 % and write a table and PNG"),
    ] = False,
    out_dir: Annotated[
        Path, typer.Option("--out-dir", help="where --sweep writes spot-deadlines.md and img/")
    ] = Path("docs"),
    starts: Annotated[
        int, typer.Option("--starts", min=1, help="--sweep: submit times per trace")
    ] = 16,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    zones: Annotated[
        bool,
        typer.Option(
            "--zones",
            help="the traces are zones over one span of time (cut to the shortest); the "
            "policies may move the job between them",
        ),
    ] = False,
    migration_minutes: Annotated[
        float | None,
        typer.Option(
            "--migration-minutes",
            help="--zones: minutes a start in another zone costs (restart + moving the checkpoint)",
        ),
    ] = None,
    zone_price: Annotated[
        list[str] | None,
        typer.Option(
            "--zone-price",
            help="--zones: spot USD per node-hour, once per --trace in order, or once for all "
            "(default: the spot price)",
        ),
    ] = None,
) -> None:
    """Cost and finish time of each spot policy on a spot availability trace, and its gap to
    the offline optimum (the cheapest schedule that meets the deadline, the trace known).
    With --zones, the multi-zone policies over several traces taken as zones."""
    if zones:
        _zones_command(
            trace, job_hours, overhead_minutes, deadline_hours, policy, price_ratio,
            on_demand_price, spot_price, nodes, start_hour, sweep, out_dir, starts, json_out,
            migration_minutes, zone_price,
        )  # fmt: skip
        return
    from orchestrator.spot.optimal import OPTIMAL
    from orchestrator.spot.policies import POLICY_NAMES, get_policy

    names = list(dict.fromkeys(policy or (*POLICY_NAMES, *((OPTIMAL,) if sweep else ()))))
    for name in names:
        if name != OPTIMAL:
            get_policy(name)  # unknown names fail here, before any work
    for hours in job_hours:
        _check_hours(hours, "--job-hours")
    _check_hours(overhead_minutes, "--overhead-minutes", allow_zero=True)
    _check_hours(start_hour, "--start-hour", allow_zero=True)
    prices = _prices(on_demand_price, spot_price, price_ratio)
    if sweep:
        _run_sweep(trace, job_hours, names, overhead_minutes * 60, prices, nodes, starts, out_dir)
        return
    if len(trace) != 1 or len(job_hours) != 1:
        raise SpecError(
            "give one --trace and one --job-hours (several are for --sweep)",
            hint="add --sweep --out-dir DIR to sweep deadline slack over several",
        )
    if deadline_hours is None:
        raise SpecError("--deadline-hours is missing", hint="e.g. --deadline-hours 13")
    _check_hours(deadline_hours, "--deadline-hours")
    _run_one(
        trace[0], names, job_hours[0], deadline_hours, overhead_minutes * 60, prices, nodes,
        start_hour, json_out,
    )  # fmt: skip


def _prices(on_demand_price: str, spot_price: str | None, price_ratio: str) -> Prices:
    from orchestrator.spot.simulate import Prices

    od_price = _positive_decimal(on_demand_price, "--on-demand-price")
    spot = (
        _positive_decimal(spot_price, "--spot-price")
        if spot_price is not None
        else od_price * _positive_decimal(price_ratio, "--price-ratio")
    )
    return Prices(on_demand=od_price, spot=spot)


def _run_one(
    trace_path: Path,
    names: list[str],
    job_hours: float,
    deadline_hours: float,
    overhead_s: float,
    prices: Prices,
    nodes: int,
    start_hour: float,
    json_out: bool,
) -> None:
    from orchestrator.providers.traces import load_trace
    from orchestrator.spot.optimal import OPTIMAL, optimal, with_gap
    from orchestrator.spot.policies import get_policy
    from orchestrator.spot.simulate import Scenario, simulate

    data = load_trace(trace_path)
    start_tick = int(start_hour * 3600 // data.gap_s)
    if start_tick >= len(data):
        raise SpecError(
            f"--start-hour {start_hour:g} is past the end of {data.name} "
            f"({data.duration_s / 3600:.1f} h)"
        )
    scenario = Scenario(
        job_s=job_hours * 3600,
        deadline_s=deadline_hours * 3600,
        overhead_s=overhead_s,
        prices=prices,
        nodes=nodes,
        start_tick=start_tick,
    )
    best = optimal(data, scenario)
    results = {
        name: best
        if name == OPTIMAL
        else with_gap(simulate(data, get_policy(name), scenario), best)
        for name in names
    }
    if json_out:
        document = {name: None if r is None else r.as_dict() for name, r in results.items()}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    table = Table(
        title=f"{data.name}: {job_hours:g} h job, deadline {deadline_hours:g} h, "
        f"restart {overhead_s / 60:g} min, on-demand ${prices.on_demand}/h, "
        f"spot ${prices.spot:.4f}/h"
    )
    columns = ("policy", "cost $", "vs optimal", "finish h", "deadline", "spot h", "on-demand h")
    for column in (*columns, "starts"):
        table.add_column(
            column, justify="left" if column == "policy" else "right", no_wrap=column == "policy"
        )
    for name, result in results.items():
        if result is None:  # the optimum of a deadline nothing can meet
            table.add_row(name, "-", "-", "-", "infeasible", "-", "-", "-")
            continue
        finish = "-" if result.finish_s is None else f"{result.finish_s / 3600:.2f}"
        gap = "-" if result.gap_to_optimal is None else f"{result.gap_to_optimal * 100:+.1f} %"
        table.add_row(
            name, f"{result.cost:.2f}", gap, finish, "met" if result.met_deadline else "MISSED",
            f"{result.spot_s / 3600:.2f}", f"{result.on_demand_s / 3600:.2f}",
            str(result.restarts),
        )  # fmt: skip
    make_console().print(table)


def _run_sweep(
    traces: list[Path],
    job_hours: list[float],
    names: list[str],
    overhead_s: float,
    prices: Prices,
    nodes: int,
    starts: int,
    out_dir: Path,
) -> None:
    from orchestrator.providers.traces import load_trace
    from orchestrator.report.sweep import write_report  # matplotlib: only when sweeping
    from orchestrator.spot.sweep import sweep

    loaded = [load_trace(path) for path in traces]
    cells = sweep(
        loaded,
        job_hours=job_hours,
        policies=names,
        overhead_s=overhead_s,
        prices=prices,
        starts=starts,
        nodes=nodes,
    )
    setup = (
        f"Restart overhead {overhead_s / 60:g} min, on-demand ${prices.on_demand}/h, "
        f"spot ${prices.spot:.4f}/h, {nodes} node(s), {starts} submit times spread over "
        f"each trace, jobs of {', '.join(f'{h:g}' for h in job_hours)} h."
    )
    page, image = write_report(cells, setup, out_dir)
    make_console().print(f"wrote {page} and {image}")


def _zones_command(
    traces: list[Path],
    job_hours: list[float],
    overhead_minutes: float,
    deadline_hours: float | None,
    policy: list[str] | None,
    price_ratio: str,
    on_demand_price: str,
    spot_price: str | None,
    nodes: int,
    start_hour: float,
    sweep: bool,
    out_dir: Path,
    starts: int,
    json_out: bool,
    migration_minutes: float | None,
    zone_price: list[str] | None,
) -> None:
    """`orch simulate --zones`: check the flags (SpecError, exit 2), then one job or a sweep."""
    from orchestrator.spot.optimal import OPTIMAL
    from orchestrator.spot.zones import ZONE_POLICY_NAMES, get_zone_policy

    if len(traces) < 2:
        raise SpecError(
            "--zones needs at least two --trace, one per zone",
            hint="e.g. --zones --trace us-east-1a.json --trace us-west-2a.json",
        )
    if migration_minutes is None:
        raise SpecError(
            "--migration-minutes is missing (what a move to another zone costs)",
            hint="e.g. --migration-minutes 20: a restart plus moving the checkpoint",
        )
    _check_hours(migration_minutes, "--migration-minutes", allow_zero=True)
    _check_hours(overhead_minutes, "--overhead-minutes", allow_zero=True)
    _check_hours(start_hour, "--start-hour", allow_zero=True)
    for hours in job_hours:
        _check_hours(hours, "--job-hours")
    if sweep:
        names = list(dict.fromkeys(policy or ("uniform-progress",)))
        for name in names:
            get_zone_policy(f"{name}-mz")  # the single-zone name, run both ways
    else:
        names = list(dict.fromkeys(policy or (*ZONE_POLICY_NAMES, OPTIMAL)))
        for name in names:
            if name != OPTIMAL:
                get_zone_policy(name)
    prices = _prices(on_demand_price, spot_price, price_ratio)
    given = [_positive_decimal(text, "--zone-price") for text in zone_price or ()]
    if len(given) not in (0, 1, len(traces)):
        raise SpecError(
            f"{len(given)} --zone-price for {len(traces)} zones",
            hint="give one --zone-price per --trace, in the same order, or one for all",
        )
    spot_prices = tuple(given * len(traces)) if len(given) == 1 else tuple(given)
    from orchestrator.providers.traces import load_trace
    from orchestrator.spot.zones import Zones

    loaded = Zones.from_traces([load_trace(path) for path in traces])
    if sweep:
        _zones_sweep(
            loaded, job_hours, names, overhead_minutes * 60, migration_minutes * 60, prices,
            spot_prices, nodes, starts, out_dir,
        )  # fmt: skip
        return
    if len(job_hours) != 1:
        raise SpecError("give one --job-hours (several are for --sweep)")
    if deadline_hours is None:
        raise SpecError("--deadline-hours is missing", hint="e.g. --deadline-hours 13")
    _check_hours(deadline_hours, "--deadline-hours")
    _zones_one(
        loaded, names, job_hours[0], deadline_hours, overhead_minutes * 60,
        migration_minutes * 60, prices, spot_prices, nodes, start_hour, json_out,
    )  # fmt: skip


def _zones_one(
    zones: Zones,
    names: list[str],
    job_hours: float,
    deadline_hours: float,
    overhead_s: float,
    migration_s: float,
    prices: Prices,
    spot_prices: tuple[Decimal, ...],
    nodes: int,
    start_hour: float,
    json_out: bool,
) -> None:
    from orchestrator.spot.optimal import OPTIMAL
    from orchestrator.spot.optimal_zones import optimal_zones
    from orchestrator.spot.simulate import Scenario
    from orchestrator.spot.zones import (
        ZoneScenario,
        get_zone_policy,
        simulate_zones,
        with_zone_gap,
    )

    start_tick = int(start_hour * 3600 // zones.gap_s)
    if start_tick >= len(zones):
        raise SpecError(
            f"--start-hour {start_hour:g} is past the end of the zones' common span "
            f"({len(zones) * zones.gap_s / 3600:.1f} h)"
        )
    job = ZoneScenario(
        Scenario(
            job_s=job_hours * 3600, deadline_s=deadline_hours * 3600, overhead_s=overhead_s,
            prices=prices, nodes=nodes, start_tick=start_tick,
        ),
        migration_s,
        spot_prices,
    )  # fmt: skip
    zone_prices = job.prices_for(zones.size)
    best = optimal_zones(zones, job)
    results = {
        name: with_zone_gap(simulate_zones(zones, get_zone_policy(name), job), best)
        for name in names
        if name != OPTIMAL
    }
    optimum = None if best is None else {"cost": float(best), "met_deadline": True}
    if json_out:
        document: dict[str, object] = {
            name: (optimum if name == OPTIMAL else results[name].as_dict()) for name in names
        }
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    table = Table(
        title=f"{len(zones.names)} zones ({', '.join(zones.names)}): {job_hours:g} h job, "
        f"deadline {deadline_hours:g} h, restart {overhead_s / 60:g} min, migration "
        f"{migration_s / 60:g} min, on-demand ${prices.on_demand}/h, spot "
        + ", ".join(f"${price:.4f}" for price in zone_prices)
        + "/h"
    )
    columns = ("policy", "cost $", "vs optimal", "finish h", "deadline", "spot h")
    for column in (*columns, "on-demand h", "starts", "zone moves"):
        table.add_column(
            column, justify="left" if column == "policy" else "right", no_wrap=column == "policy"
        )
    for name in names:
        if name == OPTIMAL:
            cost = "-" if best is None else f"{best:.2f}"
            row = [name, cost, "-", "-", "infeasible" if best is None else "met"]
            table.add_row(*row, "-", "-", "-", "-")
            continue
        result = results[name]
        finish = "-" if result.finish_s is None else f"{result.finish_s / 3600:.2f}"
        gap = "-" if result.gap_to_optimal is None else f"{result.gap_to_optimal * 100:+.1f} %"
        table.add_row(
            name, f"{result.cost:.2f}", gap, finish, "met" if result.met_deadline else "MISSED",
            f"{result.spot_s / 3600:.2f}", f"{result.on_demand_s / 3600:.2f}",
            str(result.restarts), str(result.zone_switches),
        )  # fmt: skip
    make_console().print(table)


def _zones_sweep(
    zones: Zones,
    job_hours: list[float],
    names: list[str],
    overhead_s: float,
    migration_s: float,
    prices: Prices,
    spot_prices: tuple[Decimal, ...],
    nodes: int,
    starts: int,
    out_dir: Path,
) -> None:
    from orchestrator.report.sweep import write_zones_report
    from orchestrator.spot.zone_sweep import zone_sweep

    cells = zone_sweep(
        zones,
        job_hours=job_hours,
        overhead_s=overhead_s,
        migration_s=migration_s,
        prices=prices,
        spot_prices=spot_prices,
        policies=names,
        starts=starts,
        nodes=nodes,
    )
    zone_prices = spot_prices or (prices.spot,) * zones.size
    setup = (
        f"{zones.size} zones over {len(zones) * zones.gap_s / 3600:.0f} h (the traces cut to "
        f"the shortest, ticks of {zones.gap_s:g} s): "
        + ", ".join(
            f"`{name.removesuffix('.json')}` (spot ${price:.4f}/h)"
            for name, price in zip(zones.names, zone_prices, strict=True)
        )
        + f". Restart overhead {overhead_s / 60:g} min, migration to another zone "
        f"{migration_s / 60:g} min, on-demand ${prices.on_demand}/h, {nodes} node(s), "
        f"{starts} submit times, jobs of {', '.join(f'{h:g}' for h in job_hours)} h."
    )
    page = write_zones_report(cells, setup, out_dir)
    make_console().print(f"wrote {page}")
