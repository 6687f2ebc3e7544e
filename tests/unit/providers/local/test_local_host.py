"""Finding a local node's processes, among this machine's real processes."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from orchestrator.providers.local.host import (
    pid_alive,
    pid_runs,
    pids_with_marker,
    sshd_pids_on_port,
)
from tests.support.waiting import wait_until

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; all killed and reaped at its end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def start(
    started: list[subprocess.Popen[bytes]],
    argv: list[str],
    env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> int:
    process = subprocess.Popen(argv, env=env, pass_fds=pass_fds)
    started.append(process)
    return process.pid


def test_marker_finds_exactly_the_nodes_processes(spawn: list[subprocess.Popen[bytes]]) -> None:
    node = f"l-{secrets.randbelow(10**10):010d}"
    mine = {
        start(spawn, ["sleep", "60"], {"ORCH_LOCAL_NODE": node}),
        start(spawn, ["sleep", "60"], {"A": "1", "ORCH_LOCAL_NODE": node}),
    }
    start(spawn, ["sleep", "60"], {"ORCH_LOCAL_NODE": node + "2"})  # a longer id
    start(spawn, ["sleep", "60"], {"X": f"ORCH_LOCAL_NODE={node}"})  # not the marker
    assert pids_with_marker(node) == mine


def test_a_zombie_is_not_running(spawn: list[subprocess.Popen[bytes]]) -> None:
    config = f"/n/{secrets.token_hex(4)}/sshd_config"
    zombie = start(spawn, [sys.executable, "-c", "pass", "sshd:", "-f", config])
    os.waitid(os.P_PID, zombie, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    running = start(spawn, [sys.executable, "-c", SLEEP, "sshd:", "-f", config])
    assert not pid_alive(zombie) and not pid_runs(zombie, config)
    # its command line, read while a loaded machine may still be starting it, shows in time
    wait_until(lambda: pid_runs(running, config), "the running process's command line", 10)
    assert pid_alive(running)
    assert not pid_runs(running, "/other/sshd_config")
    assert not pid_alive(0)


def test_sshd_processes_are_found_by_their_port(spawn: list[subprocess.Popen[bytes]]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.socket() as client:
        port = server.getsockname()[1]
        fd = (server.fileno(),)
        listener = start(spawn, [sys.executable, "-c", SLEEP, "sshd:", "[listener]"], pass_fds=fd)
        start(spawn, [sys.executable, "-c", SLEEP, "python", "client.py"], pass_fds=fd)  # no sshd
        client.connect(("127.0.0.1", port))
        accepted, _ = server.accept()
        with accepted:
            session = start(
                spawn,
                [sys.executable, "-c", SLEEP, "sshd:", "root@notty"],
                pass_fds=(accepted.fileno(),),
            )
        with socket.create_server(("127.0.0.1", 0)) as other:
            start(
                spawn, [sys.executable, "-c", SLEEP, "sshd:", "other"], pass_fds=(other.fileno(),)
            )
        # This process holds the port's sockets no more; only its children do.
    assert sshd_pids_on_port(port) == {listener, session}
