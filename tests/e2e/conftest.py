"""A safety net for the e2e tests: whatever a test leaves running under its ORCH_HOME ends.

The tests use `tmp_path / "orch"` as ORCH_HOME. A test that fails half-way may leave a
detached controller and its nodes behind; after each test its controllers are killed and its
local nodes terminated, so one failure cannot leak sshd processes or namespaces into the rest
of the run (pytest later deletes the directory that would have let anyone find them).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.providers.local.provider import LocalProvider
from tests.support.sandbox_run import SandboxProcess, sandbox_turn


@pytest.fixture(autouse=True)
def _end_what_the_test_left(tmp_path: Path) -> Iterator[None]:
    yield
    home = tmp_path / "orch"
    if not home.exists():
        return
    for pid_file in home.glob("jobs/*/controller.pid"):
        with contextlib.suppress(OSError, ValueError):  # already gone
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    provider = LocalProvider(Settings(home=home))
    leftovers = [node.instance_id for node in provider.list_owned()]
    if leftovers:
        provider.terminate(leftovers)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[SandboxProcess]:
    """A running `orch sandbox aws` of the test's own, stopped (every host removed) after it;
    tests in other workers wait for their turn (`sandbox_turn`)."""
    with sandbox_turn():
        running = SandboxProcess(tmp_path / "sandbox-home").start()
        try:
            yield running
        finally:
            if running.run is not None and running.run.proc.poll() is None:
                running.stop()
