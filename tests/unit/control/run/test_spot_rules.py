"""Pure pieces of spot handling: the node's notice lines, recovery numbers, seeded draws."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.control.run.recovery_rules import (
    NOTICE_MARGIN_S,
    Interruption,
    backoff_seconds,
    may_recover,
    salvage_seconds,
)
from orchestrator.node.spot_notice import follow_command, notice_document, parse_poller_line
from orchestrator.providers.local.chaos import ReclaimDraws

NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)


def test_poller_lines_are_read_and_garbage_is_not_an_error() -> None:
    assert parse_poller_line("ready\n").kind == "ready"
    assert parse_poller_line("notice " + "[" * 200_000).kind == "garbage"  # past json's depth
    line = parse_poller_line('notice {"action": "terminate", "time": "2026-11-30T10:02:00Z"}')
    assert line.kind == "notice" and line.notice is not None
    assert line.notice.action == "terminate"
    assert line.notice.time == NOW + timedelta(minutes=2)
    assert parse_poller_line("unavailable URLError(timed out)").detail == "URLError(timed out)"
    for text in ("", "notice {not json", "notice [1, 2]", "readyx", "\x00\xff"):
        assert parse_poller_line(text).kind == "garbage"
    untimed = parse_poller_line('notice {"action": "stop", "time": "soon"}')
    assert untimed.notice is not None and untimed.notice.time is None


def test_notice_document_is_what_ec2_posts() -> None:
    assert notice_document(NOW + timedelta(seconds=90.7)) == {
        "action": "terminate",
        "time": "2026-11-30T10:01:30Z",
    }


def test_the_notice_file_is_followed_from_its_first_line() -> None:
    argv = shlex.split(follow_command())
    assert argv == [
        "exec",
        "tail",
        "-n",
        "+1",
        "-F",
        "-s",
        "0.2",
        "$HOME/orch-jobs/.node/spot-notices",
        "2>/dev/null",
    ]


def _interruption(cause: str, reclaim_in: float | None) -> Interruption:
    reclaim_at = None if reclaim_in is None else NOW + timedelta(seconds=reclaim_in)
    return Interruption((1,), ("l-1",), cause, "x", NOW, reclaim_at)  # type: ignore[arg-type]


def test_salvage_fits_inside_the_notice() -> None:
    assert salvage_seconds(_interruption("notice", 120), NOW, 60) == 60
    assert salvage_seconds(_interruption("notice", 10), NOW, 60) == 10 - NOTICE_MARGIN_S
    assert salvage_seconds(_interruption("notice", 1), NOW, 60) == 0
    assert salvage_seconds(_interruption("notice", None), NOW, 60) == 0
    assert salvage_seconds(_interruption("lost", None), NOW, 60) == 0


def test_recoveries_and_backoff() -> None:
    assert may_recover(0, 1) and not may_recover(1, 1) and not may_recover(0, 0)
    assert [backoff_seconds(a, 10) for a in (1, 2, 3, 9)] == [10, 20, 40, 300]


def test_seeded_reclaims_repeat_and_follow_the_rate() -> None:
    first, second = ReclaimDraws(7, 6.0), ReclaimDraws(7, 6.0)
    waits = [next(first.waits()) for _ in range(400)]
    assert waits == [next(second.waits()) for _ in range(400)]
    assert 8.0 < sum(waits) / len(waits) < 12.0  # mean 10 s at 6 per minute
    picks = {first.pick(["a", "b", "c"]) for _ in range(50)}
    assert picks == {"a", "b", "c"}
    with pytest.raises(ValueError):
        ReclaimDraws(1, 0)
