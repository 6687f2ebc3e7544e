"""`NodeConnection.stream` against a real sshd node: lines as they come, stop, stalls, loss."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.errors import NodeUnreachable, OrchError, StreamStalled
from orchestrator.remote.lines import CUT_MARK, DEFAULT_MAX_LINE
from orchestrator.remote.ssh import NodeConnection
from tests.support.helpers import loopback_cluster
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path_factory.mktemp("orch"), "s", count=1) as built:
        yield built


@pytest.fixture
def node(cluster: Cluster) -> NodeConnection:
    return cluster.head


def running(node: NodeConnection, marker: str) -> bool:
    """Whether a process with `marker` in its command line runs (`[x]yz`: not this shell)."""
    return node.run(f"pgrep -f '[{marker[0]}]{marker[1:]}' > /dev/null", check=False).ok


def test_lines_come_decoded_in_order_with_the_exit_status(node: NodeConnection) -> None:
    node.run("true")
    transport = node.transport
    command = "printf 'one\\nzwei \\xc3\\xa4\\n\\xff bad\\n'; sleep 0.3; printf 'last'; exit 3"
    with node.stream(command) as lines:
        got = list(lines)
        assert lines.exit_status() == 3
    assert got == ["one", "zwei ä", "\ufffd bad", "last"]
    assert node.transport is transport  # the node's open connection, not a new one
    assert list(node.stream(["printf", "%s\\n", "a b; $c"])) == ["a b; $c"]


def test_close_from_another_thread_ends_the_command(node: NodeConnection) -> None:
    marker = f"tick-{uuid.uuid4().hex[:8]}"
    for pty in (False, True):
        lines = node.stream(f"while :; do echo {marker}; sleep 0.1; done", pty=pty)
        got: list[str] = []
        for text in lines:
            got.append(text.strip())
            if len(got) == 3:
                threading.Timer(0.3, lines.close).start()
        assert got[:3] == [marker] * 3 and lines.closed
        wait_until(lambda: not running(node, marker), "the command's end after close()", 5,
                   interval=0.1)  # fmt: skip
    assert node.is_alive()


def test_a_silent_command_stalls_and_a_long_line_is_cut(node: NodeConnection) -> None:
    marker = f"quiet-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    # With a pseudo-terminal, closing the stream hangs up even a command that prints nothing.
    lines = node.stream(f"echo ready; exec -a {marker} sleep 60", pty=True, idle_timeout_s=1.0)
    got: list[str] = []
    with pytest.raises(StreamStalled, match="printed nothing for 1 s") as info:
        got.extend(lines)
    assert [text.strip() for text in got] == ["ready"] and 1.0 <= time.monotonic() - started < 10
    assert isinstance(info.value, NodeUnreachable) and lines.closed
    wait_until(lambda: not running(node, marker), "the command's end", 5, interval=0.1)

    cut = list(node.stream("head -c 5000 /dev/zero | tr '\\0' x; echo; echo after", max_line=1000))
    assert cut == ["x" * 200 + CUT_MARK.format(max_line=1000), "after"]


def test_an_endless_line_costs_a_bounded_buffer_and_linear_time(node: NodeConnection) -> None:
    """256 MiB of NULs without a newline, then a line, over the real connection: the stream
    (with its default line cap) hands over the cut line and the next one, never holding more
    than the cap. Bound: the controller's Python heap (the transport's buffers included)
    peaks below 8 MiB; the old reader held the whole line and copied it at every read."""
    node.run("true")
    got: list[str] = []
    lines = node.stream("head -c 256M /dev/zero; echo; echo after")
    tracemalloc.start()
    try:
        reader = threading.Thread(target=lambda: got.extend(lines))
        reader.start()
        reader.join(120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        lines.close()
    assert not reader.is_alive(), "256 MiB took more than 120 s to read"
    assert got == ["\ufffd" * 200 + CUT_MARK.format(max_line=DEFAULT_MAX_LINE), "after"]
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_a_lost_connection_is_the_remote_layer_s_error(node: NodeConnection) -> None:
    lines = node.stream("while :; do echo alive; sleep 0.1; done")
    threading.Timer(0.5, node.abort).start()
    seen = 0
    with pytest.raises(NodeUnreachable) as info:
        for _ in lines:
            seen += 1
    assert seen >= 1 and isinstance(info.value, OrchError)
    assert node.run("echo back").stdout.strip() == "back"  # the next command reconnects


def test_an_unreachable_node_cannot_stream(node: NodeConnection) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = NodeConnection(
        dataclasses.replace(node.address, port=port), node.identity, connect_timeout=2.0
    )
    with pytest.raises(NodeUnreachable):
        gone.stream("echo never")
