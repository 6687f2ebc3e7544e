"""A checkpoint pull from a node that is gone, or goes away, pulls nothing this time instead of
failing the job, and a transfer the controller gives up on ends at once, its ssh included.

Real rsync, a real ssh that is refused, a real transport that hangs like ssh to a dead host,
and a real local node whose sshd stops taking connections between the listing and the transfer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import NodeUnreachable
from orchestrator.remote.sync import run_rsync
from tests.support.checkpoint_nodes import end_run, keeper_nodes, wait_for_manifests

HANGING_SSH = """#!/bin/sh
# Stands in for ssh to a host that stopped answering: connected, then nothing, for long.
echo $$ > "$(dirname "$0")/transport.pid"
exec sleep 60
"""

SLOW_EXITING_REFUSED_SSH = """#!/bin/sh
# ssh refused by the node, closing its pipes a moment before it exits 255.
echo "ssh: connect to host node port 22: Connection refused" >&2
exec >&- <&-
sleep 0.5
exit 255
"""


def test_ssh_that_cannot_connect_is_an_unreachable_node(tmp_path: Path) -> None:
    source = tmp_path / "payload"
    source.write_text("x")
    argv = ["rsync", "-e", "ssh -p 1 -o BatchMode=yes", str(source), "127.0.0.1:payload"]
    with pytest.raises(NodeUnreachable, match="the node could not be reached"):
        run_rsync(argv, what="checkpoint pull")


def test_a_refused_ssh_is_an_unreachable_node_when_rsync_says_its_stream_broke(
    tmp_path: Path,
) -> None:
    """rsync 3.5 exits 12, not 255, when it finds its pipe closed before ssh has exited (about
    one refused connection in twenty here): this transport always lets it see that first."""
    argv = _rsync_through(tmp_path, SLOW_EXITING_REFUSED_SSH)
    with pytest.raises(NodeUnreachable, match=r"could not be reached.*Connection refused"):
        run_rsync(argv, what="checkpoint pull")


def test_an_aborted_transfer_ends_at_once_with_its_transport(tmp_path: Path) -> None:
    argv = _rsync_through(tmp_path, HANGING_SSH)
    abort = threading.Event()
    threading.Timer(1.0, abort.set).start()
    started = time.monotonic()
    with pytest.raises(NodeUnreachable, match="cut short: the node was found gone"):
        run_rsync(argv, what="checkpoint pull", timeout=120, abort=abort)
    assert time.monotonic() - started < 10  # not the transport's 60 s
    pid = int((tmp_path / "transport.pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), "the transport lives on"
    with pytest.raises(NodeUnreachable, match="not started"):
        run_rsync(argv, what="checkpoint pull", abort=abort)  # already set: not even tried


def _rsync_through(tmp_path: Path, transport_script: str) -> list[str]:
    """argv of an rsync pushing a small file with `transport_script` standing in for ssh."""
    transport = tmp_path / "transport"
    transport.write_text(transport_script)
    transport.chmod(0o755)
    source = tmp_path / "payload"
    source.write_text("x")
    return ["rsync", "-e", str(transport), str(source), "node:payload"]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_node_0_refusing_the_transfer_pulls_nothing_and_the_next_pull_takes_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    with keeper_nodes(home, "gone-1") as nodes:
        nodes.run(0, "mkdir -p ckpt/step-000004 && printf w > ckpt/step-000004/state.pt"
                     " && : > ckpt/step-000004/COMPLETE")  # fmt: skip
        end_run(nodes.cluster, "gone-1")
        # staged: the agent is done (no rsync has run yet)
        wait_for_manifests(nodes, lambda manifest: manifest.done, "every agent done")
        (node_dir,) = [p for p in home.glob("local/nodes/*") if (p / "sshd.pid").exists()]
        sshd = int((node_dir / "sshd.pid").read_text())
        os.kill(sshd, signal.SIGSTOP)  # the listener stops taking connections; the open one
        try:  # (the manifest's) still answers, as when a node dies between the two
            collected = nodes.keeper.collect()
            assert collected.installed == []
            assert nodes.mirror.latest_complete() is None  # nothing half installed
        finally:
            os.kill(sshd, signal.SIGCONT)
        collected = nodes.keeper.collect()
        assert [u.name for u in collected.installed] == ["step-000004"]
        assert (nodes.mirror.root / "step-000004" / "state.pt").read_text() == "w"
