"""Spot availability traces: loading, validation, and replaying one against wall time."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.errors import TraceError
from orchestrator.providers.traces import SpotTrace, TraceClock, load_trace, parse_trace
from tests.unit.trace_files import shared_trace_paths

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def write(tmp_path: Path, document: object, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_shared_traces_load() -> None:
    traces = {path.name: load_trace(path) for path in shared_trace_paths()}
    east = traces["1-node_aws-02-15-2023_us-east-1a_v100_1.json"]
    assert (east.gap_s, len(east)) == (195.0, 20158)
    assert set(east.counts) == {0, 1}
    sixteen = traces["16-node_aws-08-27-2023_us-west-2a_v100_1.json"]
    assert (sixteen.gap_s, len(sixteen), max(sixteen.counts)) == (300.0, 4736, 16)
    assert sixteen.spot_fraction(nodes=16) < sixteen.spot_fraction(nodes=1)


def test_a_valid_trace_round_trips(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, {"metadata": {"gap_seconds": 60}, "data": [0, 2, 1]}))
    assert trace == SpotTrace(name="trace.json", gap_s=60.0, counts=(0, 2, 1))
    assert trace.duration_s == 180
    assert trace.availability(nodes=2) == (False, True, False)
    assert trace.available(1, nodes=2) and not trace.available(2, nodes=2)


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ([0, 1], "JSON object"),
        ({"data": [0, 1]}, "gap_seconds is missing"),
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "positive number"),
        ({"metadata": {"gap_seconds": True}, "data": [1]}, "positive number"),
        ({"metadata": {"gap_seconds": "60"}, "data": [1]}, "positive number"),
        ({"metadata": {"gap_seconds": 60}, "data": []}, "non-empty list"),
        ({"metadata": {"gap_seconds": 60}}, "non-empty list"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, -1]}, "data[1]"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, 0.5]}, "data[1]"),
        ({"metadata": {"gap_seconds": 60}, "data": [True]}, "data[0]"),
    ],
)
def test_bad_traces_say_what_is_wrong(document: object, says: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(document, "bad.json")
    assert info.value.exit_code == 2
    assert says in str(info.value)
    assert "bad.json" in str(info.value)


def test_unreadable_files_are_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"metadata": ')
    with pytest.raises(TraceError, match="not valid JSON"):
        load_trace(broken)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not valid JSON"):
        load_trace(binary)


# --------------------------------------------------------------------------------------------
# TraceClock

TRACE = SpotTrace(name="t", gap_s=100.0, counts=(1, 1, 0, 0, 2, 1))


def test_clock_compresses_trace_time() -> None:
    clock = TraceClock(TRACE, started_at=T0, time_scale=100.0)  # one tick per wall second
    assert clock.tick_at(T0) == 0
    assert clock.tick_at(T0 + timedelta(seconds=2.5)) == 2
    assert clock.trace_seconds(T0 + timedelta(seconds=2.5)) == pytest.approx(250)
    assert clock.spot_available(T0 + timedelta(seconds=1.99))
    assert not clock.spot_available(T0 + timedelta(seconds=2))
    assert clock.spot_count(T0 + timedelta(seconds=4)) == 2
    assert clock.spot_available(T0 + timedelta(seconds=4), nodes=2)
    assert not clock.spot_available(T0 + timedelta(seconds=5), nodes=2)


def test_clock_holds_the_ends() -> None:
    clock = TraceClock(TRACE, started_at=T0, time_scale=100.0)
    assert clock.tick_at(T0 - timedelta(hours=1)) == 0
    assert clock.tick_at(T0 + timedelta(hours=1)) == len(TRACE) - 1
    assert clock.spot_available(T0 + timedelta(days=1))


def test_clock_next_change() -> None:
    clock = TraceClock(TRACE, started_at=T0, time_scale=10.0)  # a tick every 10 s
    assert clock.next_change(T0) == T0 + timedelta(seconds=20)
    assert clock.next_change(T0 + timedelta(seconds=25)) == T0 + timedelta(seconds=40)
    assert clock.next_change(T0, nodes=2) == T0 + timedelta(seconds=40)
    assert clock.next_change(T0 + timedelta(seconds=45)) is None
    assert clock.tick_start(3) == T0 + timedelta(seconds=30)


def test_clock_refuses_naive_times_and_bad_scales() -> None:
    with pytest.raises(ValueError, match="timezone"):
        TraceClock(TRACE, started_at=datetime(2025, 1, 1))
    for scale in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="time_scale"):
            TraceClock(TRACE, started_at=T0, time_scale=scale)
