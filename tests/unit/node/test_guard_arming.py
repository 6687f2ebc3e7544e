"""The guard's arming check and what the controller makes of it.

A node's guard tries its poweroff path when armed (`sudo -n true` when the command uses sudo)
and writes what it found to its status file; the controller reads every node's status with
`status_command` and records a guard that cannot act as a WARNING event and a warning line.
Here the guard program runs for real in a temporary home with a stand-in `sudo` first on its
PATH; the controller's command runs in a local shell with that home, in place of SSH.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import cast

import pytest

from orchestrator.control.run import guards as guards_module
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import RunnerOptions, SilentReporter
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.node import guard
from orchestrator.node.guard_protocol import (
    GuardLayout,
    GuardTerms,
    parse_status,
    status_command,
)
from orchestrator.providers.base import Provider
from orchestrator.spec.model import JobSpec
from tests.support.waiting import wait_until

JOB_ID = "arm-1"
POWEROFF = "sudo shutdown -h now"
PASSWORD = "sudo: a password is required"


def fake_sudo(bin_dir: Path, *, works: bool) -> Path:
    """A `sudo` that logs its arguments and, unless `works`, refuses as sudo does without a
    cached password."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / "sudo.log"
    script = bin_dir / "sudo"
    body = "exit 0" if works else f"echo '{PASSWORD}' >&2\nexit 1"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\n{body}\n')
    script.chmod(0o755)
    return log


def write_terms(path: Path, home: Path, poweroff: str = POWEROFF) -> Path:
    terms = GuardTerms(
        job_id=JOB_ID, interval_s=3600.0, silence_s=10.0, allowance_s=100.0, deadman_s=600.0,
        stop_grace_s=5.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
    )  # fmt: skip
    now = datetime.now(UTC)
    path.write_text(
        terms.for_node(now=now, hourly_usd=Decimal(1), poweroff=poweroff, home=str(home))
    )
    return path


def on_path(monkeypatch: pytest.MonkeyPatch, bin_dir: Path) -> None:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


# --- the node's side ------------------------------------------------------------------------
def test_a_sudo_that_asks_for_a_password_is_the_guards_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check runs `sudo -n true` (never waits for a password) and names sudo's answer."""
    log = fake_sudo(tmp_path / "bin", works=False)
    on_path(monkeypatch, tmp_path / "bin")
    node = guard.Guard(str(write_terms(tmp_path / "terms.json", tmp_path / "home")))
    assert node.poweroff_problem() == f"sudo asks for a password here ({PASSWORD})"
    assert log.read_text().splitlines() == ["-n true"]


def test_a_working_poweroff_path_is_no_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sudo(tmp_path / "bin", works=True)
    on_path(monkeypatch, tmp_path / "bin")
    node = guard.Guard(str(write_terms(tmp_path / "terms.json", tmp_path / "home")))
    assert node.poweroff_problem() is None
    plain = write_terms(tmp_path / "plain.json", tmp_path / "home", poweroff="true")
    assert guard.Guard(str(plain)).poweroff_problem() is None


def test_a_poweroff_program_missing_from_the_node_is_the_guards_problem(tmp_path: Path) -> None:
    terms = write_terms(tmp_path / "t.json", tmp_path / "home", poweroff="/nonexistent/poweroff")
    assert (
        guard.Guard(str(terms)).poweroff_problem() == "'/nonexistent/poweroff' is not on this node"
    )
    broken = write_terms(tmp_path / "b.json", tmp_path / "home", poweroff="sudo 'shutdown")
    assert "does not parse" in (guard.Guard(str(broken)).poweroff_problem() or "")


# --- the controller's side ------------------------------------------------------------------
class Lines(SilentReporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


class LocalNodes(Attempt):
    """Nodes whose homes are local directories: `read` runs the command in a shell there."""

    def __init__(self, homes: list[Path]) -> None:
        super().__init__()
        self.homes = homes

    def read(self, command: str) -> list[str]:
        return [
            subprocess.run(
                ["bash", "-c", command],
                env={**os.environ, "HOME": str(home)},
                capture_output=True,
                text=True,
                timeout=15,
                check=False,
            ).stdout
            for home in self.homes
        ]


@pytest.fixture
def armed(tmp_path: Path) -> Iterator[list[Path]]:
    """Two nodes' homes with a guard armed on each: node 0's sudo refuses, node 1's works."""
    guards: list[subprocess.Popen[bytes]] = []
    homes = []
    for rank, works in enumerate((False, True)):
        home = tmp_path / f"node{rank}"
        bin_dir = home / "bin"
        fake_sudo(bin_dir, works=works)
        terms = write_terms(home / "terms.json", home)
        env = {
            **os.environ,
            "HOME": str(home),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        }
        guards.append(
            subprocess.Popen(
                [sys.executable, guard.__file__, str(terms)], env=env, cwd=home,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        )  # fmt: skip
        homes.append(home)
    try:
        for home in homes:
            status = home / "orch-jobs" / JOB_ID / "guard" / "status.json"
            wait_until(status.exists, f"the guard's {status}", timeout=20, interval=0.05)
        yield homes
    finally:
        for proc in guards:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


def guards_of(ledger: Ledger, reporter: Lines) -> Guards:
    spec = JobSpec.model_validate(
        {"name": "arm", "workdir": ".", "run": "true", "budget": {"max_runtime": 3600}}
    )
    job = ledger.add_job(
        Job(
            id=JOB_ID, name=spec.name, provider="local", nodes=2, gpus_per_node=1,
            spec_json=spec.model_dump_json(), spec_path="job.yaml", created_at=utcnow(),
        )
    )  # fmt: skip
    journal = Journal(job, ledger, reporter)
    keys = Path(str(ledger.engine.url.database)).parent / "keys"
    return Guards(journal, spec, RunnerOptions(), cast(Provider, None), reporter, keys=keys)


def test_a_guard_that_cannot_power_off_is_a_warning_event_and_a_warning_line(
    ledger: Ledger, armed: list[Path]
) -> None:
    """Node 0's guard found sudo asking for a password: the controller says so, naming the
    node and the reason, and does not claim the nodes are guarded."""
    reported = [
        parse_status(text) for text in LocalNodes(armed).read(status_command(GuardLayout(JOB_ID)))
    ]
    assert [s.armed for s in reported] == [True, True]
    assert [s.problem for s in reported] == [f"sudo asks for a password here ({PASSWORD})", None]

    reporter = Lines()
    guards = guards_of(ledger, reporter)
    guards.check(LocalNodes(armed))
    events = [(e.kind, e.message) for e in ledger.events(JOB_ID)]
    assert [kind for kind, _ in events] == ["WARNING"]
    message = events[0][1]
    assert "a guard cannot end its node without the controller" in message
    assert f"node 0: sudo asks for a password here ({PASSWORD})" in message
    assert "node 1" not in message and "sudo -n" in message
    assert reporter.lines == [
        f"[orch] warning: guard: node 0: sudo asks for a password here ({PASSWORD})"
    ]


def test_guards_that_can_act_are_recorded_as_armed(ledger: Ledger, armed: list[Path]) -> None:
    reporter = Lines()
    guards = guards_of(ledger, reporter)
    guards.check(LocalNodes(armed[1:]))
    events = [(e.kind, e.message) for e in ledger.events(JOB_ID)]
    assert [kind for kind, _ in events] == ["GUARDED"]
    assert "guards armed on 1 node(s): max_runtime 3600 s" in events[0][1]
    assert reporter.lines == []


class GuardsStartingLate(LocalNodes):
    """Nodes whose guards have written nothing for the first `late` looks, as after a boot
    that started sshd before the guard."""

    def __init__(self, homes: list[Path], late: int) -> None:
        super().__init__(homes)
        self.late = late
        self.looks = 0

    def read(self, command: str) -> list[str]:
        self.looks += 1
        return [""] * len(self.homes) if self.looks <= self.late else super().read(command)


def test_a_guard_still_starting_is_asked_again_before_it_counts_as_missing(
    ledger: Ledger, armed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guards_module, "GUARD_START_POLL_S", 0.01)
    nodes = GuardsStartingLate(armed[1:], late=3)
    guards_of(ledger, Lines()).check(nodes)
    assert [e.kind for e in ledger.events(JOB_ID)] == ["GUARDED"]
    assert nodes.looks == 4


def test_a_node_without_a_running_guard_is_a_warning(
    tmp_path: Path, ledger: Ledger, armed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guards_module, "GUARD_START_WAIT_S", 0.3)  # then it counts as missing
    bare = tmp_path / "bare"
    bare.mkdir()
    reporter = Lines()
    guards = guards_of(ledger, reporter)
    guards.check(LocalNodes([armed[1], bare]))
    [event] = ledger.events(JOB_ID)
    assert event.kind == "WARNING" and "node 1: no guard runs" in event.message
    assert reporter.lines == ["[orch] warning: guard: node 1: no guard runs"]
