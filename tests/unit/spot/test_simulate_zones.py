"""Several zones (`orchestrator.spot.zones`, `orchestrator.spot.optimal_zones`): hand-made
traces where the right zone is plain, the multi-zone optimum worked out by hand, deadlines met
and the optimum a floor on generated traces, and `orch simulate --zones`."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.cli.simulate import simulate_command
from orchestrator.errors import OrchError
from orchestrator.providers.traces import SpotTrace, load_trace
from orchestrator.report.sweep import BEGIN, END, ZONES_BEGIN, ZONES_END
from orchestrator.spot.optimal import optimal
from orchestrator.spot.optimal_zones import grid_steps, optimal_zones, optimal_zones_costs
from orchestrator.spot.policies import POLICY_NAMES, get_policy
from orchestrator.spot.simulate import Prices, Scenario, simulate
from orchestrator.spot.zones import (
    ZONE_POLICY_NAMES,
    Zones,
    ZoneScenario,
    get_zone_policy,
    simulate_zones,
    with_zone_gap,
)
from tests.support.fuzzing import examples
from tests.support.helpers import orch_env, run_orch
from tests.unit.trace_files import availability_traces, shared_trace_paths

PRICES = Prices.from_ratio()  # 3.06 on-demand, 1.02 spot
UP = "uniform-progress-mz"


def usd(seconds: float, price: Decimal) -> Decimal:
    return (Decimal(repr(seconds)) * price / 3600).quantize(Decimal("0.0001"))


def zones(*counts: list[int], gap_s: float = 100.0) -> Zones:
    return Zones(
        names=tuple(f"z{i}" for i in range(len(counts))),
        gap_s=gap_s,
        counts=tuple(tuple(c) for c in counts),
    )


def job(
    job_s: float,
    deadline_s: float,
    overhead_s: float,
    migration_s: float,
    spot_prices: tuple[Decimal, ...] = (),
    start_tick: int = 0,
) -> ZoneScenario:
    scenario = Scenario(
        job_s=job_s, deadline_s=deadline_s, overhead_s=overhead_s, prices=PRICES,
        start_tick=start_tick,
    )  # fmt: skip
    return ZoneScenario(scenario, migration_s, spot_prices)


# --------------------------------------------------------------------------------------------
# The policy on hand-made traces


def test_spot_in_the_only_zone_that_has_it() -> None:
    """Zone 0 never has spot, zone 1 always: the first start goes to zone 1 (a restart, not a
    migration: the job has no checkpoint yet) and the job runs there, 50 + 1000 s on spot."""
    result = simulate_zones(zones([0] * 30, [1] * 30), get_zone_policy(UP), job(1000, 5000, 50, 80))
    assert result.cost == usd(1050, PRICES.spot)
    assert (result.finish_s, result.zone_switches, result.on_demand_s) == (1050, 0, 0)


def test_a_reclaim_moves_the_job_to_the_zone_that_still_has_spot() -> None:
    """Zone 0 has spot for 5 ticks, zone 1 always. Start in zone 0 (same price, the first),
    50 + 450 s; reclaimed at tick 5: move to zone 1, an 80 s migration and the last 550 s,
    done at 500 + 630 = 1130 s with 1130 s of spot billed."""
    result = simulate_zones(
        zones([1] * 5 + [0] * 25, [1] * 30), get_zone_policy(UP), job(1000, 5000, 50, 80)
    )
    assert result.cost == usd(1130, PRICES.spot)
    assert (result.finish_s, result.zone_switches, result.preemptions) == (1130, 1, 1)
    assert result.met_deadline


def test_the_cheapest_zone_first_and_the_checkpoint_zone_while_it_has_spot() -> None:
    """Zone 0 at 1.50 $/h has spot all along; zone 1 at 1.00 $/h from tick 2. The job starts
    in zone 0 (the only one with spot) and stays there, though zone 1 is cheaper from tick 2:
    a move would cost the migration. With spot in both from the start, zone 1 it is."""
    prices = (Decimal("1.50"), Decimal("1.00"))
    stay = simulate_zones(
        zones([1] * 30, [0, 0] + [1] * 28), get_zone_policy(UP), job(1000, 5000, 50, 80, prices)
    )
    assert stay.cost == usd(1050, prices[0])
    assert stay.zone_switches == 0
    cheapest = simulate_zones(
        zones([1] * 30, [1] * 30), get_zone_policy(UP), job(1000, 5000, 50, 80, prices)
    )
    assert cheapest.cost == usd(1050, prices[1])


def test_no_move_when_the_migration_cannot_be_afforded_before_the_deadline() -> None:
    """Zone 0 loses spot at tick 3 and zone 1 has it, but the deadline leaves room for one
    more restart only (time left 1500 - 300 - 100 (a tick) - 750 work = 350 s < two 200 s
    migrations): the job must not move, and on-demand where it is meets the deadline."""
    result = simulate_zones(
        zones([1] * 3 + [0] * 27, [1] * 30), get_zone_policy(UP), job(1000, 1500, 50, 200)
    )
    assert result.met_deadline
    assert result.zone_switches == 0
    assert result.on_demand_s == 50 + 750


def test_one_zone_is_the_single_zone_simulator() -> None:
    trace = load_trace(next(p for p in shared_trace_paths() if "us-west-2a" in p.name))
    alone = Zones.from_traces([trace])
    for name in POLICY_NAMES:
        for start, deadline_h in ((0, 13), (5000, 11), (9000, 20)):
            scenario = Scenario(
                job_s=10 * 3600, deadline_s=deadline_h * 3600, overhead_s=720, prices=PRICES,
                start_tick=start,
            )  # fmt: skip
            single = simulate(trace, get_policy(name), scenario)
            multi = simulate_zones(alone, get_zone_policy(f"{name}-mz"), ZoneScenario(scenario, 1))
            assert (multi.cost, multi.finish_s, multi.restarts) == (
                single.cost, single.finish_s, single.restarts,
            ), name  # fmt: skip
            assert multi.zone_switches == 0


def test_traces_of_different_ticks_share_the_finest_clock() -> None:
    """A 100 s trace and a 300 s one: ticks of 100 s, each 300 s value held three ticks, cut
    to the shorter span (the 300 s trace's 3 ticks: 900 s)."""
    fine = SpotTrace(name="fine", gap_s=100.0, counts=(1,) * 12)
    coarse = SpotTrace(name="coarse", gap_s=300.0, counts=(0, 1, 2))
    aligned = Zones.from_traces([fine, coarse])
    assert (aligned.gap_s, len(aligned)) == (100.0, 9)
    assert aligned.counts[1] == (0, 0, 0, 1, 1, 1, 2, 2, 2)


def test_unknown_zone_policy_is_refused() -> None:
    with pytest.raises(OrchError) as info:
        get_zone_policy("cheapest-mz")
    assert info.value.exit_code == 2
    assert set(ZONE_POLICY_NAMES) == {f"{name}-mz" for name in POLICY_NAMES}


# --------------------------------------------------------------------------------------------
# The optimum, by hand


def test_the_optimum_starts_where_spot_lasts() -> None:
    """Zone 0 has spot for 2 ticks, zone 1 always; 300 s job, 50 s restart, 150 s migration.
    Zone 1 from the start: 350 s of spot. Zone 0 first: 50 + 150 s, then a 150 s migration
    and 150 s more: 500 s. The policy takes zone 0 (equal prices, the first) and pays 500."""
    both = zones([1, 1] + [0] * 20, [1] * 22)
    scenario = job(300, 1000, 50, 150)
    assert optimal_zones(both, scenario) == usd(350, PRICES.spot)
    policy = simulate_zones(both, get_zone_policy(UP), scenario)
    assert policy.cost == usd(500, PRICES.spot)
    assert with_zone_gap(policy, usd(350, PRICES.spot)).gap_to_optimal == pytest.approx(
        500 / 350 - 1, abs=1e-3
    )


def test_the_optimum_migrates_only_when_waiting_misses_the_deadline() -> None:
    """Zone 0 has spot in ticks 0-4, zone 1 from tick 5; 800 s job, 50 s restart, 100 s
    migration. Deadline 2000 s: wait for zone 1 and run 50 + 800 s there (done at 1350 s),
    850 s of spot. Deadline 1300 s: that is too late; zone 0 for 5 ticks (450 s of work), then
    the migration and 350 s in zone 1, done at 950 s: 950 s of spot."""
    two = zones([1] * 5 + [0] * 25, [0] * 5 + [1] * 25)
    loose, tight = optimal_zones_costs(two, job(800, 2000, 50, 100), [2000, 1300])
    assert loose == usd(850, PRICES.spot)
    assert tight == usd(950, PRICES.spot)


def test_no_optimum_when_the_deadline_is_shorter_than_job_and_restart() -> None:
    assert optimal_zones(zones([1] * 30, [1] * 30), job(1000, 1050, 100, 100)) is None


def test_grid_steps_put_both_overheads_on_the_grid() -> None:
    # 195 s ticks: a 720 s restart leaves 135 s of a tick, a 1200 s migration 30 s: 15 s cells
    assert grid_steps(195.0, 720.0, 1200.0) == 13
    assert grid_steps(100.0, 50.0, 100.0) == 2


# --------------------------------------------------------------------------------------------
# Generated traces


def trace_sets() -> st.SearchStrategy[Zones]:
    one = availability_traces([100.0], longest_run=8, most_runs=12, repeat=20)
    return st.lists(one, min_size=2, max_size=3).map(Zones.from_traces)


jobs = st.fixed_dictionaries(
    {
        "job_s": st.integers(200, 2500),
        "overhead_s": st.integers(0, 250),
        "extra_s": st.integers(0, 900),  # migration = restart + moving the checkpoint
        "slack": st.floats(0.05, 1.0),
        "cheap": st.sampled_from([(), (Decimal("1.02"), Decimal("0.8"), Decimal("1.5"))]),
    }
)


def zone_job(all_zones: Zones, drawn: dict[str, object]) -> ZoneScenario:
    """The drawn job, its deadline within the traces (past their end only on-demand runs)."""
    job_s, overhead_s = int(drawn["job_s"]), int(drawn["overhead_s"])  # type: ignore[call-overload]
    prices: tuple[Decimal, ...] = drawn["cheap"][: all_zones.size]  # type: ignore[index]
    assume((job_s + overhead_s) * (1 + float(drawn["slack"])) <= len(all_zones) * all_zones.gap_s)  # type: ignore[arg-type]
    return job(
        job_s,
        (job_s + overhead_s) * (1 + float(drawn["slack"])),  # type: ignore[arg-type]
        overhead_s,
        overhead_s + int(drawn["extra_s"]),  # type: ignore[call-overload]
        prices,
    )


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(all_zones=trace_sets(), drawn=jobs)
def test_deadline_aware_zone_policies_meet_every_feasible_deadline(
    all_zones: Zones, drawn: dict[str, object]
) -> None:
    scenario = zone_job(all_zones, drawn)
    for name in ("uniform-progress-mz", "greedy-mz", "on-demand-mz"):
        result = simulate_zones(all_zones, get_zone_policy(name), scenario)
        assert result.met_deadline, (name, result)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(all_zones=trace_sets(), drawn=jobs)
def test_the_multi_zone_optimum_is_a_floor(all_zones: Zones, drawn: dict[str, object]) -> None:
    """No policy that meets the deadline, over the zones or in one of them, costs less."""
    scenario = zone_job(all_zones, drawn)
    best = optimal_zones(all_zones, scenario)
    assert best is not None
    costs = [simulate_zones(all_zones, get_zone_policy(n), scenario) for n in ZONE_POLICY_NAMES]
    prices = scenario.prices_for(all_zones.size)
    for zone in range(all_zones.size):
        in_zone = Scenario(
            **{**scenario.scenario.__dict__, "prices": Prices(PRICES.on_demand, prices[zone])}
        )
        costs += [simulate(all_zones.trace(zone), get_policy(n), in_zone) for n in POLICY_NAMES]
    for result in costs:
        if result.met_deadline:  # exact grid: only float rounding of the bill is left
            assert result.cost >= best - Decimal("0.001"), (result, best)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=availability_traces([100.0, 195.0], longest_run=8, most_runs=12, repeat=20),
    drawn=jobs,
)
def test_with_one_zone_the_optimum_is_the_single_zone_one(
    trace: SpotTrace, drawn: dict[str, object]
) -> None:
    alone = Zones.from_traces([trace])
    scenario = zone_job(alone, {**drawn, "cheap": ()})
    single = optimal(trace, scenario.scenario)
    multi = optimal_zones(alone, scenario)
    assert single is not None and multi is not None
    assert abs(single.cost - multi) <= Decimal("0.001"), (single.cost, multi)


# --------------------------------------------------------------------------------------------
# orch simulate --zones


def _traces() -> list[str]:
    return [str(path) for path in shared_trace_paths()]


def test_orch_simulate_zones_json(tmp_path: Path) -> None:
    args = ["simulate", "--zones", *(f"--trace={path}" for path in _traces())]
    args += ["--job-hours", "2", "--deadline-hours", "3", "--overhead-minutes", "12"]
    args += ["--migration-minutes", "20", "--start-hour", "100", "--json"]
    result = run_orch(args, orch_env(tmp_path / "home"), timeout=120)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert list(document) == [*ZONE_POLICY_NAMES, "optimal"]
    optimum = document["optimal"]["cost"]
    for name in ZONE_POLICY_NAMES:
        policy = document[name]
        assert {"cost", "met_deadline", "zone_switches", "gap_to_optimal"} <= set(policy)
        if name != "spot-only-mz":
            assert policy["met_deadline"] is True
        if policy["met_deadline"]:
            assert policy["cost"] >= optimum - 0.001
            assert policy["gap_to_optimal"] == pytest.approx(policy["cost"] / optimum - 1, abs=1e-3)
    # the same run in process gives the same numbers
    all_zones = Zones.from_traces([load_trace(Path(path)) for path in _traces()])
    scenario = ZoneScenario(
        Scenario(
            job_s=7200, deadline_s=3 * 3600, overhead_s=720, prices=PRICES,
            start_tick=int(100 * 3600 // all_zones.gap_s),
        ),
        1200,
    )  # fmt: skip
    best = optimal_zones(all_zones, scenario)
    direct = with_zone_gap(simulate_zones(all_zones, get_zone_policy(UP), scenario), best)
    assert document[UP] == direct.as_dict()
    assert optimum == pytest.approx(float(best))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"trace": [Path("a.json")]}, "--zones needs at least two --trace"),
        ({"migration_minutes": None}, "--migration-minutes is missing"),
        ({"zone_price": ["1", "2"]}, "--zone-price"),
        ({"policy": ["uniform-progress"]}, "unknown multi-zone spot policy"),
    ],
)
def test_simulate_zones_refuses_bad_flags(changes: dict[str, object], says: str) -> None:
    flags: dict[str, object] = {
        "trace": [Path(path) for path in _traces()],
        "job_hours": [2.0],
        "deadline_hours": 3.0,
        "overhead_minutes": 12.0,
        "zones": True,
        "migration_minutes": 20.0,
    }
    with pytest.raises(OrchError) as info:
        simulate_command(**{**flags, **changes})  # type: ignore[arg-type]
    assert info.value.exit_code == 2
    assert says in str(info.value)


def test_orch_simulate_zones_sweep_writes_its_own_part(tmp_path: Path) -> None:
    """The multi-zone section goes between its own markers; the single-zone part and the prose
    around both are kept."""
    out = tmp_path / "docs"
    out.mkdir()
    page = out / "spot-deadlines.md"
    page.write_text(f"prose\n\n{BEGIN}\nsingle-zone tables\n{END}\n\nmore prose\n")
    traces = [path for path in _traces() if "1-node" in path]
    args = ["simulate", "--sweep", "--zones", *(f"--trace={path}" for path in traces)]
    args += ["--job-hours", "2", "--overhead-minutes", "12", "--migration-minutes", "20"]
    args += ["--starts", "2", "--out-dir", str(out)]
    result = run_orch(args, orch_env(tmp_path / "home"), timeout=300)
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert text.startswith(f"prose\n\n{BEGIN}\nsingle-zone tables\n{END}\n\nmore prose\n")
    assert ZONES_BEGIN in text and text.rstrip().endswith(ZONES_END)
    assert "`uniform-progress-mz` / best zone" not in text  # headers name the policy
    assert "uniform-progress-mz / best zone" in text
    assert "Target: `uniform-progress-mz` at most 0.85x" in text
    rows = [line for line in text.splitlines() if re.match(r"\| 2 \| \d+ % \|", line)]
    assert len(rows) == 10  # one per slack
    assert all("(2/2)" in row for row in rows)


def test_spot_dearer_than_on_demand_is_left_for_a_zone_where_it_pays() -> None:
    """Zone 0's spot costs 4.00 $/h, above on-demand's 3.06; zone 1's 1.00 $/h, from tick 2.
    The job waits for zone 1 rather than taking zone 0 or committing to on-demand: 200 s of
    waiting, then 50 + 1000 s on zone 1's spot."""
    prices = (Decimal("4.00"), Decimal("1.00"))
    result = simulate_zones(
        zones([1] * 30, [0, 0] + [1] * 28), get_zone_policy(UP), job(1000, 5000, 50, 80, prices)
    )
    assert result.cost == usd(1050, prices[1])
    assert (result.finish_s, result.on_demand_s) == (1250, 0)
