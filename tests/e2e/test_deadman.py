"""The dead-man switch: a node whose controller vanished ends itself once training is over."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import network_namespaces, orch_env, processes_with_marker, run_orch
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_nodes_outlive_a_dead_controller_while_training_then_power_off(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    # Each node says its training ended in a folder of the test's, outside the node: a node
    # that powers off takes its disk with it, and the first node to end may be gone before
    # the second ends.
    ended = tmp_path / "ended"
    ended.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: orphan\nworkdir: work\n"
        'run: python -c "import os, pathlib, time; time.sleep(10); '
        f"pathlib.Path('{ended}', os.environ['ORCH_NODE_RANK']).touch()\"\n"
        "resources: {nodes: 2, gpus_per_node: 1}\n"
    )
    home = tmp_path / "orch"
    env = orch_env(home, ORCH_WATCH_INTERVAL="1", ORCH_DEADMAN_TIMEOUT="3")
    result = run_orch(["submit", str(spec), "--detach"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().splitlines()[-1]
    ledger = Ledger(make_engine(home / "orch.db"))
    wait_until(lambda: ledger.get_job(job_id).state == "RUNNING", "RUNNING", 60, interval=0.1)
    ids = [lease.instance_id for lease in ledger.leases(job_id)]
    pid = int((home / "jobs" / job_id / "controller.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # no orch command runs from here on: nobody revives it
    killed = time.monotonic()
    run_dirs = [home / "local/nodes" / iid / "disk/orch-jobs" / job_id / "run" for iid in ids]
    # The subject: time passing past the dead-man timeout (3 s) while the run still trains.
    time.sleep(5)
    assert not any((run_dir / "exit_code").exists() for run_dir in run_dirs)
    assert all(processes_with_marker(iid) for iid in ids), "a node ended while training"
    try:
        wait_until(
            lambda: sorted(p.name for p in ended.iterdir()) == ["0", "1"],
            "training's end by itself on both nodes",
            120 - (time.monotonic() - killed),  # torchrun's start on two busy cores: tens of s
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_runs_now(run_dirs, home)}") from None

    def node_left(iid: str) -> bool:
        return bool(
            processes_with_marker(iid)
            or any(iid in ns for ns in network_namespaces())
            or (home / "local/nodes" / iid).exists()
        )

    wait_until(
        lambda: not any(node_left(iid) for iid in ids), "the nodes' power-off",
        150 - (time.monotonic() - killed), interval=0.5,
    )  # fmt: skip
    # Each powered itself off for the dead-man's reason, not while training.
    for iid in ids:
        record = json.loads((home / "local/powered-off" / f"{iid}.json").read_text())
        assert record.get("kind") == "deadman", record
        assert "no training" in record.get("message", ""), record
    # The next orch command hears of it: the job gets a controller, finds its nodes gone and
    # ends; no lease stays open.
    run_orch(["reconcile"], env, timeout=120)
    wait_until(
        lambda: not ledger.leases(job_id, open_only=True), "every lease closed", 120,
        interval=0.5,
    )  # fmt: skip


def _runs_now(run_dirs: list[Path], home: Path) -> str:
    """What each node's run folder holds, its log's end, and the local nodes' power-offs: why
    a run did not end."""
    lines = []
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            lines.append(f"{run_dir}: gone (the node powered off)")
            continue
        names = sorted(p.name for p in run_dir.iterdir())
        log = run_dir / "node.log"
        tail = log.read_text(errors="replace")[-2000:] if log.is_file() else "(no log)"
        lines.append(f"{run_dir}: {names}\n{tail}")
    for record in sorted((home / "local/powered-off").glob("*.json")):
        lines.append(f"{record.name}: {record.read_text().strip()}")
    poweroff_log = home / "local/poweroff.log"
    if poweroff_log.is_file():
        lines.append(poweroff_log.read_text(errors="replace")[-2000:])
    return "\n".join(lines)
