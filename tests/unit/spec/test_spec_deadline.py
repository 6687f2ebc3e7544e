"""The job spec's `deadline` and `spot_policy`: parsing, validation, and what errors say."""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.spec.loading import load_job
from orchestrator.spec.model import JobSpec, SpotPolicyName
from orchestrator.spot.policies import POLICY_NAMES
from orchestrator.spot.zones import ZONE_POLICY_NAMES
from tests.unit.spec_cases import MINIMAL, spec_error, write

SUBMIT = datetime(2025, 6, 30, 12, 0, tzinfo=UTC)


def load(project: Path, extra: str) -> JobSpec:
    return load_job(write(project, MINIMAL + extra)).spec


def test_no_deadline_no_policy_by_default(project: Path) -> None:
    spec = load(project, "")
    assert (spec.deadline, spec.spot_policy) == (None, None)
    assert spec.deadline_at(SUBMIT) is None


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("36h", 36 * 3600.0), ("90m", 5400.0), ("1d12h", 36 * 3600.0), ("7200", 7200.0)],
)
def test_deadline_as_a_duration_after_submit(project: Path, written: str, seconds: float) -> None:
    spec = load(project, f"deadline: {written}\n")
    assert spec.deadline == seconds
    assert spec.deadline_at(SUBMIT) == SUBMIT + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "written",
    [
        "2025-07-01T18:00:00Z",  # a YAML timestamp
        '"2025-07-01T18:00:00Z"',  # a string
        '"2025-07-01T20:00:00+02:00"',  # another timezone: converted to UTC
        "2025-07-01 18:00:00+00:00",
    ],
)
def test_deadline_as_an_absolute_time(project: Path, written: str) -> None:
    spec = load(project, f"deadline: {written}\n")
    expected = datetime(2025, 7, 1, 18, 0, tzinfo=UTC)
    assert spec.deadline == expected
    assert spec.deadline.tzinfo == UTC  # type: ignore[union-attr]
    assert spec.deadline_at(SUBMIT) == expected
    assert spec.deadline_at(SUBMIT + timedelta(days=3)) == expected


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("2025-07-01T18:00:00", "has no timezone: end it with Z for UTC"),
        ('"2025-07-01 18:00"', "has no timezone"),
        ("2025-07-01", "needs a time"),
        ('"2025-13-01T18:00:00Z"', "invalid deadline"),
        ("tomorrow", "invalid deadline 'tomorrow'"),
        ("0", "positive duration"),
        ("-2h", "invalid deadline"),
        ("true", "invalid deadline true"),
        ("[1]", "invalid deadline"),
    ],
)
def test_bad_deadlines_name_the_field_and_line(project: Path, written: str, says: str) -> None:
    message = spec_error(write(project, MINIMAL + f"deadline: {written}\n"))
    assert "deadline" in message
    assert "line 4" in message
    assert says in message


def test_spot_policy_names_match_the_policies() -> None:
    assert typing.get_args(SpotPolicyName) == POLICY_NAMES + ZONE_POLICY_NAMES


@pytest.mark.parametrize("policy", POLICY_NAMES + ZONE_POLICY_NAMES)
def test_every_policy_is_accepted_with_a_deadline(project: Path, policy: str) -> None:
    spec = load(project, f"deadline: 30h\nspot_policy: {policy}\n")
    assert spec.spot_policy == policy


@pytest.mark.parametrize("policy", ["on-demand", "spot-only"])
def test_policies_without_a_deadline_need_none(project: Path, policy: str) -> None:
    assert load(project, f"spot_policy: {policy}\n").spot_policy == policy


@pytest.mark.parametrize(
    "policy", ["uniform-progress", "greedy", "uniform-progress-mz", "greedy-mz"]
)
def test_deadline_policies_need_a_deadline(project: Path, policy: str) -> None:
    message = spec_error(write(project, MINIMAL + f"spot_policy: {policy}\n"))
    assert f"spot_policy {policy} needs a deadline" in message
    assert "line 4" in message


def test_a_bad_deadline_is_reported_once(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "deadline: soon\nspot_policy: greedy\n"))
    assert "invalid deadline 'soon'" in message
    assert "needs a deadline" not in message


def test_unknown_policy_lists_the_known_ones(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "deadline: 2h\nspot_policy: cheapest\n"))
    assert "spot_policy" in message
    assert "line 5" in message
    for name in POLICY_NAMES:
        assert name in message


@pytest.mark.parametrize("deadline", ["36h", "2025-07-01T18:00:00Z"])
def test_deadline_and_policy_round_trip_through_json(project: Path, deadline: str) -> None:
    spec = load(project, f"deadline: {deadline}\nspot_policy: uniform-progress\n")
    dumped = spec.model_dump(mode="json")
    assert JobSpec.model_validate(dumped) == spec
    assert dumped["spot_policy"] == "uniform-progress"
