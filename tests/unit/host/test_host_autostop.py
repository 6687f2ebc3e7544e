"""`orchestrator.host.autostop`: which jobs keep a controller host up, and when an idle one
stops (`IdleClock`, a pure value: every step is a new clock), also when its orch cannot list
its jobs (the dead-man rule)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.host.autostop import IdleClock, finished, unfinished
from orchestrator.host.daemon import HANDOVER_MAX_S, handing_over, last_seen, own
from orchestrator.job_state import FINAL_STATES, JobState


def test_unfinished_keeps_the_jobs_not_in_a_final_state_in_order() -> None:
    jobs = [{"id": f"j-{state.value}", "state": state.value} for state in JobState]
    live = [f"j-{s.value}" for s in JobState if s not in FINAL_STATES]
    assert unfinished(jobs) == live
    assert "j-RUNNING" in live and "j-SUCCEEDED" not in unfinished(jobs)


@pytest.mark.parametrize("state", ["SOMETHING_NEW", None, ""])
def test_a_state_this_version_does_not_know_counts_as_unfinished(state: str | None) -> None:
    assert unfinished([{"id": "j-1", "state": state}]) == ["j-1"]
    assert unfinished([{"id": "j-2"}]) == ["j-2"]


def test_no_jobs_none_unfinished() -> None:
    assert unfinished([]) == []


def test_the_clock_starts_at_the_first_idle_tick_and_keeps_that_start() -> None:
    clock = IdleClock(10, None).tick(100.0, 0)
    assert clock.idle_since == 100.0
    clock = clock.tick(104.0, 0)
    assert clock.idle_since == 100.0, "a later idle tick must not move the start"
    assert clock.remaining(104.0) == 6.0
    assert not clock.should_stop(109.9)
    assert clock.should_stop(110.0) and clock.should_stop(500.0)
    assert clock.remaining(500.0) == 0.0, "never negative"


def test_a_job_resets_the_clock_and_the_next_idle_spell_starts_afresh() -> None:
    clock = IdleClock(10, None).tick(100.0, 0).tick(109.0, 2)
    assert clock.idle_since is None and clock.remaining(109.0) is None
    assert not clock.should_stop(1000.0), "a host driving a job never stops"
    clock = clock.tick(120.0, 0)
    assert clock.idle_since == 120.0
    assert not clock.should_stop(129.0) and clock.should_stop(130.0)


def test_a_host_with_jobs_from_the_start_is_not_idle() -> None:
    clock = IdleClock(10, None).tick(0.0, 1).tick(50.0, 1)
    assert clock.idle_since is None and not clock.should_stop(50.0)


@pytest.mark.parametrize("autostop_s", [0, -5])
def test_autostop_zero_or_less_never_stops(autostop_s: float) -> None:
    clock = IdleClock(autostop_s, None).tick(0.0, 0)
    assert clock.idle_since == 0.0
    assert clock.remaining(1e9) is None and not clock.should_stop(1e9)


def test_tick_leaves_the_old_clock_as_it_was() -> None:
    clock = IdleClock(10, None)
    clock.tick(5.0, 0)
    assert clock.idle_since is None
    assert clock.tick(5.0, 0).autostop_s == 10


def test_the_host_drives_only_the_jobs_whose_record_it_holds(tmp_path: Path) -> None:
    """On a team ledger the host's orch lists a teammate's jobs too: they keep no host up."""
    (tmp_path / "jobs" / "j-mine").mkdir(parents=True)
    (tmp_path / "jobs" / "j-mine" / "job.json").write_text("{}")
    assert own(["j-mine", "j-teammate"], tmp_path) == ["j-mine"]


def test_a_hand_over_under_way_keeps_the_host_busy_until_it_ends_or_grows_stale(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "handing-over"
    assert not handing_over(flag, 1000.0)
    flag.touch()
    os.utime(flag, (1000.0, 1000.0))
    assert handing_over(flag, 1000.0 + 60)
    assert not handing_over(flag, 1000.0 + HANDOVER_MAX_S)  # a hand-over that died half-way
    clock = IdleClock(3.0, None).tick(1060.0, 0 + handing_over(flag, 1060.0))
    assert clock.remaining(1100.0) is None  # busy: the idle time has not started


# --- the dead-man rule: a host whose orch cannot list its jobs stops all the same ------------


def test_failed_looks_keep_the_last_seen_jobs_busy_for_the_deadman_time_only() -> None:
    clock = IdleClock(10, None, seen_at=0.0, deadman_s=100).tick(50.0, 2)  # busy, seen at 50
    assert clock.seen_at == 50.0
    for now in (60.0, 100.0, 149.0):
        clock = clock.blind(now)
        assert clock.idle_since is None and not clock.should_stop(now)
    clock = clock.blind(150.0)  # 100 s without a look that worked: idle since then
    assert clock.idle_since == 150.0 and clock.remaining(150.0) == 10.0
    assert not clock.should_stop(159.0) and clock.blind(160.0).should_stop(160.0)
    assert clock.blind_for(160.0) == 110.0


def test_a_daemon_whose_every_look_fails_stops_counting_from_its_start() -> None:
    clock = IdleClock(10, None, seen_at=1000.0, deadman_s=30)
    stopped_at = None
    for now in range(1000, 1100, 5):
        clock = clock.blind(float(now))
        if clock.should_stop(float(now)):
            stopped_at = now
            break
    assert stopped_at == 1040, "at most deadman_s + autostop_s after its start"


def test_failed_looks_while_idle_leave_the_idle_count_running() -> None:
    clock = IdleClock(10, None, seen_at=0.0, deadman_s=1000).tick(5.0, 0)
    clock = clock.blind(14.0)
    assert clock.idle_since == 5.0 and clock.should_stop(15.0)


def test_a_look_that_works_again_sets_the_clock_by_what_it_shows() -> None:
    clock = IdleClock(10, None, seen_at=0.0, deadman_s=20).blind(25.0)
    assert clock.idle_since == 20.0
    clock = clock.tick(26.0, 1)  # the ledger answers again, with a job
    assert clock.idle_since is None and clock.seen_at == 26.0 and not clock.should_stop(999.0)


def test_autostop_off_is_off_for_the_deadman_too() -> None:
    clock = IdleClock(0, None, seen_at=0.0, deadman_s=1).blind(1e6)
    assert clock.remaining(1e6) is None and not clock.should_stop(1e6)


def test_a_restarted_daemon_counts_from_the_last_look_its_heartbeat_kept(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    assert last_seen(state, 42.0) == 42.0  # no heartbeat: from its own start
    state.write_text(json.dumps({"jobs_seen_at": "2024-05-01T12:00:00+00:00"}))
    assert last_seen(state, 42.0) == datetime(2024, 5, 1, 12, tzinfo=UTC).timestamp()
    state.write_text("{not json")
    assert last_seen(state, 42.0) == 42.0


def test_finished_and_unfinished_split_the_listing() -> None:
    jobs = [{"id": "a", "state": "RUNNING"}, {"id": "b", "state": "SUCCEEDED"}, {"id": "c"}]
    assert unfinished(jobs) == ["a", "c"] and finished(jobs) == ["b"]
