"""A controller host whose orch processes all died (supervisor, daemon, the job's controller:
as after the machine restarted) while the machine itself lives: `orch controller up` again
starts its daemon, which gives the job a new controller on the same host, and the job succeeds
on the nodes it had."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.providers.local.host import pids_with_marker
from tests.support.controller_host import AdoptableNode, adoptable_node, node_cmdlines
from tests.support.helpers import counter_run, counter_workdir, run_orch
from tests.support.waiting import wait_until


@pytest.fixture
def node(tmp_path: Path) -> Iterator[AdoptableNode]:
    with adoptable_node(tmp_path) as adoptable:
        yield adoptable


def host_orch_pids(instance_id: str) -> list[int]:
    """orch's processes on the host node (its venv, its supervisor), not the sshd serving it
    and not the job's nodes (which carry their own node's marker)."""
    found = []
    for pid in pids_with_marker(instance_id):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b".orch-host" in line:
            found.append(pid)
    return found


def test_up_starts_the_daemon_of_a_live_host_again_and_its_job_goes_on(
    tmp_path: Path, node: AdoptableNode
) -> None:
    iid = node.instance.instance_id
    up = run_orch(node.up_args("0"), node.env, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    counter_workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: host-restarted\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"run: {counter_run(30, step_s=0.4)}\n"
    )
    submitted = run_orch(["submit", str(spec), "--remote"], node.env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]

    def job() -> dict:
        shown = run_orch(["status", job_id, "--json"], node.env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)

    wait_until(lambda: (job()["step"] or 0) >= 2, f"{job_id} to train", 60, interval=0.5)
    nodes = [lease["instance_id"] for lease in job()["leases"]]
    for _ in range(3):  # the supervisor may start a daemon again between two kills
        for pid in host_orch_pids(iid):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: host_orch_pids(iid) == [], "orch on the host to be gone", 10)
    assert not node_cmdlines(iid, "orchestrator.host.daemon")
    down = run_orch(["controller", "status", "--json"], node.env, timeout=60)
    assert json.loads(down.stdout)["running"] is False

    again = run_orch(node.up_args("0"), node.env, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "not running: starting it again" in again.stderr, again.stderr
    assert json.loads(again.stdout)["running"] is True

    def ended() -> dict | None:
        current = job()
        return current if current["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    final = wait_until(ended, f"{job_id} to end", 90, interval=1)
    assert final["state"] == "SUCCEEDED", json.dumps(final.get("events"))[-3000:]
    shown_events = json.dumps(final.get("events"))[-4000:]
    assert (final["step"], final["recoveries"]) == (30, 0), shown_events
    assert [lease["instance_id"] for lease in final["leases"]] == nodes  # the same node

    down = run_orch(["controller", "down", "--json"], node.env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert host_orch_pids(iid) == []
