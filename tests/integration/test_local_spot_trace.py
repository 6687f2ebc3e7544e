"""Local spot capacity that follows an availability trace: launches refused while the trace
says no spot, and `orch local chaos --trace` taking spot nodes back when it turns so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.errors import CapacityError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.local.spot import follow_trace, read_capacity
from orchestrator.providers.traces import SpotTrace
from orchestrator.remote.keys import ensure_identity
from tests.integration.test_local_provider import make_settings, providers
from tests.integration.test_local_spot import loopback_provider, spot_request
from tests.support.helpers import Background, orch_env, run_orch

__all__ = ["providers"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.timeout(180)]

HOUR_TICKS = SpotTrace("hours.json", 3600.0, (1, 1, 0, 0, 2))  # an hour per tick at scale 1


def test_spot_launches_follow_the_trace_tick_in_force(
    tmp_path: Path, providers: list[LocalProvider]
) -> None:
    provider, identity = loopback_provider(tmp_path, providers)
    provider.follow_trace(HOUR_TICKS, start_tick=2)  # no spot now, for an hour
    with pytest.raises(CapacityError, match="no spot capacity"):
        provider.launch(spot_request(identity, 1, True))
    assert provider.spot_available(1) is False
    (node,) = provider.launch(spot_request(identity, 1, "auto"))
    assert node.market == "on-demand"
    provider.follow_trace(HOUR_TICKS, start_tick=0)  # one spot instance
    with pytest.raises(CapacityError):
        provider.launch(spot_request(identity, 2, True))  # two nodes need two
    (spot,) = provider.launch(spot_request(identity, 1, True))
    assert spot.market == "spot"
    provider.follow_trace(HOUR_TICKS, start_tick=4)
    assert [n.market for n in provider.launch(spot_request(identity, 2, True))] == ["spot"] * 2
    provider.set_spot_available(True)  # `on` ends the replay
    assert read_capacity(provider.store).clock is None


def test_the_trace_is_replayed_against_wall_time_at_its_scale(tmp_path: Path) -> None:
    provider = LocalProvider(make_settings(tmp_path / "orch", "loopback"))
    began = datetime(2026, 1, 1, tzinfo=UTC)
    clock = follow_trace(provider.store, HOUR_TICKS, time_scale=60, start_tick=1, now=began)
    assert clock.started_at == began - timedelta(minutes=1)  # tick 1 is in force at `began`
    capacity = read_capacity(provider.store)
    assert capacity.clock == clock
    # A minute of wall time per tick: tick 1 until +1 min, no spot until +3 min, then 2.
    for seconds, count in ((0, 1), (59, 1), (61, 0), (179, 0), (181, 2), (10**6, 2)):
        assert capacity.spot_count(began + timedelta(seconds=seconds)) == count
    assert not capacity.available_at(began + timedelta(seconds=200), nodes=3)


def test_cli_sets_shows_and_ends_a_trace(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    env = orch_env(home, ORCH_LOCAL_NETWORK="loopback")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 0, 1, 1]}))
    result = run_orch(["local", "spot", "--trace", str(trace), "--time-scale", "60"], env)
    assert result.returncode == 0, result.stderr
    assert "follows trace.json: 4 ticks of 5 s from tick 0; now 0 spot" in result.stdout
    shown = run_orch(["local", "spot"], env)
    assert "tick 0 of 4, 0 spot now" in shown.stdout
    later = run_orch(["local", "spot", "--trace", str(trace), "--start-tick", "3"], env)
    assert "now 1 spot" in later.stdout
    bad = run_orch(["local", "spot", "--trace", str(trace), "--start-tick", "4"], env)
    assert bad.returncode == 2 and "past the end of trace.json" in bad.stdout + bad.stderr
    both = run_orch(["local", "spot", "on", "--trace", str(trace)], env)
    assert both.returncode == 2
    trace.write_text('{"metadata": {}, "data": [1]}')
    broken = run_orch(["local", "spot", "--trace", str(trace)], env)
    assert broken.returncode == 2 and "gap_seconds is missing" in broken.stdout + broken.stderr
    assert run_orch(["local", "spot", "off"], env).returncode == 0
    assert "local spot capacity: refused" in run_orch(["local", "spot"], env).stdout


def test_chaos_takes_back_the_spot_nodes_the_trace_no_longer_grants(
    tmp_path: Path, providers: list[LocalProvider]
) -> None:
    home = tmp_path / "orch"
    provider = LocalProvider(make_settings(home, "loopback", price="0.90"))
    providers.append(provider)
    ledger = Ledger(make_engine(home / "orch.db"))
    ledger.add_job(
        Job(
            id="job-1", name="job", provider="local", nodes=2, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=datetime.now(UTC),
            state=JobState.RUNNING,
        )
    )  # fmt: skip
    identity = ensure_identity(tmp_path / "keys", "test")
    nodes = provider.launch(spot_request(identity, 2, True))
    trace = tmp_path / "trace.json"
    # 2 spot instances for 3 s, then 1 for 3 s, then none (3 s ticks at scale 60).
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 180}, "data": [2, 1, 0]}))
    env = orch_env(home, ORCH_LOCAL_NETWORK="loopback")
    chaos = Background(
        ["local", "chaos", "job-1", "--trace", str(trace), "--time-scale", "60"], env
    )
    try:
        chaos.wait_for("reclaim 2:", timeout=60)
        ids = [n.instance_id for n in nodes]
        assert provider.preempted(ids) == set(ids) and provider.list_owned() == []
        lines = [line for line in chaos.output.splitlines() if line.startswith("reclaim")]
        assert lines[0].startswith(f"reclaim 1: node 1 ({ids[1]})") and "trace tick 1" in lines[0]
        assert lines[1].startswith(f"reclaim 2: node 0 ({ids[0]})") and "trace tick 2" in lines[1]
        taken = [datetime.fromisoformat(provider.store.load(i).reclaimed_at) for i in ids]
        assert 2.0 <= (taken[0] - taken[1]).total_seconds() <= 4.5, taken
        ledger.update_job("job-1", state=JobState.SUCCEEDED)
        assert chaos.finish(timeout=30) == 0
        assert "done: 2 reclaim(s) of job job-1" in chaos.output
    finally:
        if chaos.proc.poll() is None:
            chaos.proc.kill()
    assert (
        run_orch(["local", "chaos", "job-1", "--trace", str(trace), "--rate", "2"], env).returncode
        == 2
    )
