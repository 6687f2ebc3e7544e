"""`orch cancel` signals a job's controller only when the lock's pid is a live orch process;
the lookup goes through psutil (no /proc on macOS), tried here on real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.control.verbs.cancel import is_orch_process
from tests.support.waiting import wait_until

SLEEP = "import time; time.sleep(60)"


def _proc(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()


def test_an_orch_controller_is_one(children: list[subprocess.Popen[bytes]]) -> None:
    # A daemon runs as `python -m orchestrator...`; a foreground submit as `.../bin/orch`.
    module = subprocess.Popen([sys.executable, "-c", SLEEP, "orchestrator.control.daemon"])
    script = subprocess.Popen(["/venv/bin/orch", "-c", SLEEP], executable=sys.executable)
    children += [module, script]
    # once exec has replaced the forked pytest image
    wait_until(lambda: is_orch_process(module.pid) and is_orch_process(script.pid),
               "both read as orch processes", 10, interval=0.02)  # fmt: skip


def test_other_and_ended_processes_are_not(children: list[subprocess.Popen[bytes]]) -> None:
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "worker"])
    children.append(other)
    zombie = subprocess.Popen(["true", "orchestrator"])
    wait_until(lambda: b"worker" in _proc(other.pid, "cmdline"), "the other's exec", 10,
               interval=0.02)  # fmt: skip
    wait_until(lambda: _proc(zombie.pid, "stat").rsplit(b")", 1)[1].split()[0] == b"Z",
               "the exited child a zombie", 10, interval=0.02)  # fmt: skip
    assert not is_orch_process(other.pid)
    assert not is_orch_process(zombie.pid)  # exited, not yet reaped
    zombie.wait()
    assert not is_orch_process(zombie.pid)  # gone
    assert not is_orch_process(2**22 + 1)  # above Linux's largest pid: never a process
