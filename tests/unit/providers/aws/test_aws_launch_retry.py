"""Which RunInstances refusals are repeated in place, and how long the provider waits."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.providers.aws.ec2_requests import (
    CAPACITY_CODES,
    launch_backoff_s,
    launch_retryable,
    transition_time,
)


@pytest.mark.parametrize("code", sorted(CAPACITY_CODES))
@pytest.mark.parametrize("status", [400, 500, 503])
def test_a_capacity_refusal_is_never_repeated_whatever_its_status(code: str, status: int) -> None:
    assert not launch_retryable(code, status)


@pytest.mark.parametrize(
    ("code", "status"),
    [("RequestLimitExceeded", 503), ("RequestLimitExceeded", 400), ("InternalError", 500),
     ("ServiceUnavailable", 503), ("", 502), ("SomethingNew", 504)],
)  # fmt: skip
def test_throttling_and_other_server_errors_are_repeated(code: str, status: int) -> None:
    assert launch_retryable(code, status)


@pytest.mark.parametrize(
    ("code", "status"),
    [("InvalidParameterValue", 400), ("UnauthorizedOperation", 403), ("", None),
     ("IdempotentParameterMismatch", 400)],
)  # fmt: skip
def test_a_client_error_is_not_repeated(code: str, status: int | None) -> None:
    assert not launch_retryable(code, status)


def test_backoff_doubles_is_capped_and_jittered() -> None:
    assert [launch_backoff_s(n, 1.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 20, 20]
    assert launch_backoff_s(3, 0.5) == 2.0
    assert launch_backoff_s(1, 0.0) == 0.0


def test_the_time_of_a_state_transition_is_read_as_ec2_and_moto_write_it() -> None:
    at = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
    assert transition_time("User initiated (2026-12-02 04:00:00 GMT)") == at
    assert transition_time("User initiated (2026-12-02 04:00:00 UTC)") == at
    assert transition_time("Client.InstanceInitiatedShutdown: Instance initiated shutdown") is None
