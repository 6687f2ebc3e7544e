"""`orch cancel` signals a job's controller only when the lock's pid is a live orch process;
the lookup goes through psutil (no /proc on macOS), tried here on real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from orchestrator.control.cancel import is_orch_process

SLEEP = "import time; time.sleep(60)"


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
    time.sleep(0.2)  # exec has replaced the forked pytest image
    assert is_orch_process(module.pid) and is_orch_process(script.pid)


def test_other_and_ended_processes_are_not(children: list[subprocess.Popen[bytes]]) -> None:
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "worker"])
    children.append(other)
    zombie = subprocess.Popen(["true", "orchestrator"])
    time.sleep(0.2)
    assert not is_orch_process(other.pid)
    assert not is_orch_process(zombie.pid)  # exited, not yet reaped
    zombie.wait()
    assert not is_orch_process(zombie.pid)  # gone
    assert not is_orch_process(2**22 + 1)  # above Linux's largest pid: never a process
