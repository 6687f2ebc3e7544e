"""Leases on each node's own clock: a node whose clock is an hour off neither stops its run an
hour early nor keeps it an hour past its lease.

The controller's side (`Guards.renew`) runs for real; each "node" is a temporary home where
its commands run in a local shell, with a `date` an hour ahead of (or behind) this machine's.
The guard reads the lease there and is judged on that node's clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import cast

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.control.run.attempt import Answer, Attempt
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import RunnerOptions, SilentReporter
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.node import guard
from orchestrator.node.guard_protocol import GuardLayout, parse_clock
from orchestrator.providers.base import Instance, Provider
from orchestrator.spec.model import JobSpec

JOB_ID = "clock-1"
MAX_RUNTIME = 100.0
HOUR = 3600.0


class SkewedNode(Attempt):
    """One node whose home is a local folder and whose clock is `skew_s` off this machine's."""

    def __init__(self, home: Path, skew_s: float) -> None:
        node = Instance(
            "i-skewed", JOB_ID, JOB_ID, 0, "10.0.0.1", "10.0.0.1", 22, "u", "k", "lo",
            "on-demand", "t", Decimal(1), utcnow(),
        )  # fmt: skip
        super().__init__([node], cast(Cluster, object()))  # connected: see `each_node`
        self.home = home
        self.skew_s = skew_s
        bin_dir = home / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "date").write_text(
            f'#!/bin/sh\n[ "$1" = "+%s%N" ] || exec /bin/date "$@"\n'
            f"exec {sys.executable} -c 'import time; print(time.time_ns() + {int(skew_s * 1e9)})'\n"
        )
        (bin_dir / "date").chmod(0o755)

    def now(self) -> float:
        return time.time() + self.skew_s

    def each_node(
        self, command: str, stdin: Callable[[int], str] | None = None
    ) -> dict[int, Answer]:
        sent = time.time_ns()
        out = subprocess.run(
            ["bash", "-c", command], input=stdin(0) if stdin else None, capture_output=True,
            text=True, check=True,
            env={**os.environ, "HOME": str(self.home), "PATH": f"{self.home}/bin:/usr/bin:/bin"},
        )  # fmt: skip
        return {0: Answer(out.stdout, sent, time.time_ns())}


def controller(ledger: Ledger, keys: Path) -> Guards:
    """A job with a max_runtime, started now: its guards' lease ends MAX_RUNTIME from now."""
    spec = JobSpec.model_validate(
        {"name": "clock", "workdir": ".", "run": "true", "budget": {"max_runtime": MAX_RUNTIME}}
    )
    job = ledger.add_job(
        Job(
            id=JOB_ID, name=spec.name, provider="local", nodes=1, gpus_per_node=1,
            spec_json=spec.model_dump_json(), spec_path="job.yaml", created_at=utcnow(),
            started_at=utcnow(),
        )
    )  # fmt: skip
    journal = Journal(job, ledger, SilentReporter())
    options = RunnerOptions()
    return Guards(journal, spec, options, cast(Provider, None), SilentReporter(), keys=keys)


def test_the_nodes_clock_is_read_between_sending_and_receiving() -> None:
    assert parse_clock("@@orch-clock 5000000000\n", 1_000_000_000, 3_000_000_000) == 3.0
    assert parse_clock("x\n@@orch-clock 1000\n", 3000, 5000) == pytest.approx(-3e-6)
    assert parse_clock("@@orch-clock 1700000000N\n", 0, 0) is None  # a `date` without %N
    assert parse_clock("", 0, 0) is None
    assert parse_clock("@@orch-clock \u00b2\u00b3\n", 0, 0) is None  # never a ValueError


@pytest.mark.parametrize("skew_s", [HOUR, -HOUR])
def test_a_skewed_node_ends_its_run_at_its_lease_on_its_own_clock(
    tmp_path: Path, ledger: Ledger, skew_s: float
) -> None:
    node = SkewedNode(tmp_path / "node", skew_s)
    guards = controller(ledger, tmp_path / "keys")
    started = time.time()
    guards.renew(node)
    assert guards.clock_offsets["i-skewed"] == pytest.approx(skew_s, abs=1.0)
    written = json.loads((node.home / GuardLayout(JOB_ID).lease).read_text())
    assert written["runtime_deadline"] == pytest.approx(started + MAX_RUNTIME + skew_s, abs=1.0)

    terms = tmp_path / "terms.json"
    terms.write_text(
        guards.terms(0.0).for_node(
            now=datetime.now(UTC), hourly_usd=Decimal(1), poweroff="true", home=str(node.home)
        )
    )  # fmt: skip
    run = node.home / "orch-jobs" / JOB_ID / "run"
    run.mkdir()
    (run / "pid").write_text(f"{os.getpid()}\n")  # the run has started
    watcher = guard.Guard(str(terms))
    watcher.anchor = node.now()  # armed now, on the node's clock (its boot terms' reference)
    watcher.armed_at = node.now() - HOUR  # and no controller heard since
    assert watcher.due(node.now()) is None, "ended early"
    assert watcher.due(node.now() + MAX_RUNTIME - 5) is None, "ended early"
    kind, since, _ = watcher.due(node.now() + MAX_RUNTIME + 5) or ("kept past its lease", 0, "")
    assert kind == "max_runtime"
    assert since == pytest.approx(started + MAX_RUNTIME + skew_s, abs=1.0)
