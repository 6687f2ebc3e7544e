"""The pure parts of bench/team_scale.py: the seeded ledger's rows, the CPU arithmetic, and
the state events it checks a submitted job by; and how `bench.figures` reads its summary."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from bench.figures import parse_team_scale
from bench.team_scale import growth, per_node_pct, row, state_sequence
from bench.team_seed import LIVE_JOBS, seed_rows

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_the_seed_is_a_realistic_mix_spread_over_months() -> None:
    seed = seed_rows(2000, NOW, months=6)
    assert len(seed.jobs) == 2000 and len({job["id"] for job in seed.jobs}) == 2000
    states = Counter(job["state"] for job in seed.jobs)
    assert states["RUNNING"] == LIVE_JOBS
    assert 0.6 < states["SUCCEEDED"] / 2000 < 0.85 and states["FAILED"] > 100
    created = [job["created_at"] for job in seed.jobs]
    assert created == sorted(created)  # the last is the newest
    assert NOW - created[0] > timedelta(days=170) and created[-1] < NOW
    for job in seed.jobs:
        assert job["ended_at"] is None or job["started_at"] <= job["ended_at"] <= NOW
    leases = Counter(lease["job_id"] for lease in seed.leases)
    for job in seed.jobs:  # a lease per node, twice for a job that recovered
        assert leases[job["id"]] == job["nodes"] * (1 + job["recoveries"])
    open_leases = {lease["job_id"] for lease in seed.leases if lease["ended_at"] is None}
    assert open_leases == {job["id"] for job in seed.jobs if job["state"] == "RUNNING"}
    kinds: dict[str, list[str]] = {}
    for event in seed.events:
        kinds.setdefault(event["job_id"], []).append(event["kind"])
    for job in seed.jobs:
        assert kinds[job["id"]][0] == "PROVISIONING"
        assert kinds[job["id"]][-1] == job["state"]
    assert seed_rows(50, NOW) == seed_rows(50, NOW)  # deterministic


def test_per_node_cpu_is_cpu_seconds_over_the_window_per_node_in_percent() -> None:
    assert per_node_pct(1.2, 60.0, 8) == pytest.approx(0.25)
    assert per_node_pct(6.0, 30.0, 1) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        per_node_pct(1.0, 0.0, 8)
    with pytest.raises(ValueError):
        per_node_pct(1.0, 10.0, 0)


def test_growth_says_how_the_per_node_figure_changes_with_n() -> None:
    assert "flat" in growth({8: 2.0, 64: 2.2})
    assert "falls with N" in growth({8: 0.24, 32: 0.13, 64: 0.09})
    assert "grows with N" in growth({8: 2.0, 32: 4.0})
    assert "grows faster than N" in growth({8: 1.0, 16: 5.0})
    assert growth({8: 2.0}) == "one size only"


def test_state_sequence_keeps_the_job_state_events_in_order() -> None:
    kinds = ["PROVISIONING", "LAUNCHED", "SYNCING", "RUNNING", "CHECKPOINT", "STOPPING"]
    assert state_sequence([*kinds, "SUCCEEDED"]) == [
        "PROVISIONING", "SYNCING", "RUNNING", "STOPPING", "SUCCEEDED",
    ]  # fmt: skip


def test_the_summary_rows_are_read_back_as_figures() -> None:
    text = "\n".join(
        [
            "team scale (machine: 2 cores, 23 GiB RAM; medians of 5 command runs)",
            row("orch cost, 10000 jobs, postgresql", 0.62, "s", 0.21, "orch --help",
                "<= 1 s", True),
            row("controller CPU per node, 32 nodes", 3.5, "%", 2.0, "per node at 8 nodes",
                "< 3 %", False),
        ]
    )  # fmt: skip
    cost, cpu = parse_team_scale(text)
    assert (cost.name, cost.value, cost.baseline, cost.unit) == (
        "orch cost, 10000 jobs, postgresql", 0.62, 0.21, "s",
    )  # fmt: skip
    assert cost.baseline_name == "orch --help" and cost.met is True
    assert cost.target == "<= 1 s"
    assert (cpu.value, cpu.baseline, cpu.unit, cpu.met) == (3.5, 2.0, "% of one core", False)
