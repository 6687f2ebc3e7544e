"""Which rsync failures mean the node could not be reached or was lost (pure classification)."""

from __future__ import annotations

import pytest

from orchestrator.remote.sync import ssh_transport_failed

CLOSED = "rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n"
REFUSED = "ssh: connect to host 127.0.0.1 port 1: Connection refused\n" + CLOSED
KEEPALIVE_GAVE_UP = "Timeout, server 10.0.0.5 not responding.\n" + CLOSED
KILLED_UNDER_A_SHARED_CONNECTION = (  # the multiplexed ssh says nothing
    "rsync: connection unexpectedly closed (25827411 bytes received so far) [receiver]\n"
    "rsync: [generator] write error: Broken pipe (32)\n"
)
REFUSED_BEFORE_RSYNC_READ = (  # rsync wrote to the closed pipe before reading from it
    "ssh: connect to host node port 22: Connection refused\n"
    "rsync: [sender] safe_write failed to write 4 bytes to socket: Broken pipe (32)\n"
)


TRANSPORT_FAILURES = [
    REFUSED,
    KEEPALIVE_GAVE_UP,
    KILLED_UNDER_A_SHARED_CONNECTION,
    REFUSED_BEFORE_RSYNC_READ,
]


@pytest.mark.parametrize("said", TRANSPORT_FAILURES)
@pytest.mark.parametrize("returncode", [255, 12])
def test_an_ssh_failure_is_one_whichever_code_rsync_gives(returncode: int, said: str) -> None:
    assert ssh_transport_failed(returncode, said + f"rsync error: (code {returncode})\n")


def test_exit_255_is_an_ssh_failure_even_without_a_message() -> None:
    assert ssh_transport_failed(255, "")


@pytest.mark.parametrize(
    ("returncode", "said"),
    [
        # rsync is missing on the node: the node answered, it needs fixing
        (12, "bash: line 1: rsync: command not found\n" + CLOSED),
        (127, "bash: line 1: rsync: command not found\n" + CLOSED),
        # a broken stream rsync does not blame on the connection
        (12, "rsync: [receiver] invalid checksum length\nrsync error: protocol data stream\n"),
        # ssh's words with rsync's other failures are not the transport's
        (23, "ssh: some files vanished\nrsync error: some files could not be transferred\n"),
        (11, "rsync: [receiver] write failed: No space left on device (28)\n"),
        (0, ""),
    ],
)
def test_other_failures_are_not_ssh_failures(returncode: int, said: str) -> None:
    assert not ssh_transport_failed(returncode, said)
