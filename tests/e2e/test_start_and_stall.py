"""Start and stall timeouts on real local nodes with real torchrun:

- a start whose rendezvous hangs (node 1's packets to the master are dropped, as Docker's
  FORWARD policy drops them) is failed after `recovery.start_timeout`, with the reason that
  names the hang, and restarted on the same nodes; once it makes progress and then stops
  (every rank stays alive), `budget.stall_timeout` stops it as STALLED (exit 5), its
  checkpoint pulled;
- the same stall with its controller killed: the node guards stop the run and power the
  nodes off (node 0 on rank 0's steps, node 1 following it), and the next orch command ends
  the job STALLED.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.node.run_progress import FOLLOW_LOOKS
from orchestrator.providers.local.net import netns_name
from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    detach,
    events,
    fast_env,
    job_json,
    network_namespaces,
    processes_with_marker,
    run_orch,
    wait_for,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

START_TIMEOUT = 12
STALL_TIMEOUT = 10
WATCH = 1  # the watch interval (fast_env)
GRACE = 5  # controller.stop_grace
MARGIN = 5  # seconds past a timeout and a watch interval that a decision may take here


def job_spec(tmp_path: Path, *, hang_once: bool) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "stall_train.py", work)
    iptables = shutil.which("iptables")
    assert iptables is not None, "the test drops node 1's packets with iptables"
    # In node 1's own network namespace: its packets to the master are dropped (SYN-SENT).
    setup = (
        f'if [ "$ORCH_NODE_RANK" = 1 ]; then {iptables} -A OUTPUT -d "$ORCH_MASTER_ADDR" '
        "-p tcp -j DROP; fi"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: stall\nworkdir: work\nrun: python stall_train.py\n"
        + (f"setup: {json.dumps(setup)}\n" if hang_once else "")
        + "resources: {nodes: 2, gpus_per_node: 1}\ncheckpoint: {dir: ckpt}\n"
        + f"recovery: {{start_timeout: {START_TIMEOUT}}}\n"
        + f"budget: {{stall_timeout: {STALL_TIMEOUT}}}\n"
    )
    return spec


def at(event: dict) -> datetime:
    return datetime.fromisoformat(event["at"])


def last_step_printed(log: Path) -> tuple[int, datetime]:
    """The last step line rank 0 printed, and when (its own `t`), from a node log."""
    steps = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("[default0]:{"):
            doc = json.loads(line.split(":", 1)[1])
            steps.append((doc["step"], datetime.fromtimestamp(doc["t"], UTC)))
    assert steps, f"no step line in {log}"
    return steps[-1]


def test_a_hung_start_is_restarted_on_its_nodes_and_a_stalled_run_stops_as_stalled(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    env = fast_env(home, ORCH_STOP_GRACE=str(GRACE))
    job_id = detach(job_spec(tmp_path, hang_once=True), env)

    hung = wait_for(job_id, env, lambda j: events(j, "START_FAILED"), "the failed start", 120)
    node1 = next(lease for lease in hung["leases"] if lease["rank"] == 1)
    subprocess.run(  # the network heals: the restart on the same nodes goes through
        ["ip", "netns", "exec", netns_name(node1["instance_id"]), "iptables", "-F", "OUTPUT"],
        check=True,
    )
    waited = run_orch(["wait", job_id, "--timeout", "180"], env, timeout=200)
    job = job_json(job_id, env)
    assert (job["state"], waited.returncode) == ("STALLED", 5), job["events"][-8:]

    (failed,) = events(job, "START_FAILED")
    first_run = events(job, "RUNNING")[0]
    took = (at(failed) - at(first_run)).total_seconds()
    assert START_TIMEOUT <= took <= START_TIMEOUT + WATCH + MARGIN, took
    master = first_run["message"].rsplit("master ", 1)[1]  # node 0's address:port
    assert f"rank 1 on node 1 never reached the master {master} (" in failed["message"]
    assert "SYN-SENT" in failed["message"]
    restart = events(job, "RECOVERING")
    assert len(restart) == 1 and "on the same nodes" in restart[0]["message"]
    assert len(job["leases"]) == 2 and job["recoveries"] == 0  # no node launched or replaced
    assert len(events(job, "RUNNING")) == 2

    step, printed = last_step_printed(home / "jobs" / job_id / "logs" / "node-0.log")
    assert step == 6 and job["step"] == 6
    stopped = (at(events(job, "STOPPING")[0]) - printed).total_seconds()
    # Read at most a watch interval after it was printed, judged at the next check: 2 intervals,
    # and 2 s for a check that runs late on a loaded machine.
    assert STALL_TIMEOUT <= stopped <= STALL_TIMEOUT + 2 * WATCH + 2, stopped
    assert "stayed at step 6" in job["reason"]
    # Stopped as a cap stops: SIGTERM (the emergency checkpoint), pull, terminate.
    assert {"step3.txt", "at-term.txt"} <= {c["name"] for c in job["checkpoints"]}
    assert_nothing_left(job)


def node_left(home: Path, iid: str) -> bool:
    return bool(
        processes_with_marker(iid)
        or any(iid in ns for ns in network_namespaces())
        or (home / "local/nodes" / iid).exists()
    )


def powered_off(home: Path, iid: str) -> dict:
    """What the local provider kept of a node its guard powered off (`at`, `kind`)."""
    return json.loads((home / f"local/powered-off/{iid}.json").read_text())


def test_the_node_guards_stop_a_stalled_run_without_its_controller(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    env = fast_env(home, ORCH_STOP_GRACE=str(GRACE))
    job_id = detach(job_spec(tmp_path, hang_once=False), env)
    job = wait_for(job_id, env, lambda j: j["state"] == "RUNNING", "the run", 120)
    os.kill(int((home / "jobs" / job_id / "controller.pid").read_text()), signal.SIGKILL)
    ids = [lease["instance_id"] for lease in sorted(job["leases"], key=lambda x: x["rank"])]
    log = home / f"local/nodes/{ids[0]}/disk/orch-jobs/{job_id}/run/node.log"
    wait_until(
        lambda: '"step": 6' in (log.read_text(errors="replace") if log.exists() else ""),
        "rank 0's last step printed", 90,
    )  # fmt: skip
    step, printed = last_step_printed(log)

    follow = FOLLOW_LOOKS * WATCH + 2  # node 1: its master refused that many looks
    limit = STALL_TIMEOUT + 2 * WATCH + GRACE + follow + MARGIN
    wait_until(
        lambda: not any(node_left(home, iid) for iid in ids), "the nodes' power-off",
        limit - (datetime.now(UTC) - printed).total_seconds(), interval=0.25,
    )  # fmt: skip
    first, second = (powered_off(home, iid) for iid in ids)
    assert (first["kind"], second["kind"]) == ("stall", "orphaned")
    decided = (datetime.fromisoformat(first["at"]) - printed).total_seconds()
    # The same for the guard, then the run's stop (at most the grace) and the poweroff.
    assert STALL_TIMEOUT <= decided <= STALL_TIMEOUT + 2 * WATCH + GRACE + 3, decided

    run_orch(["reconcile"], env, timeout=120)  # the next orch command takes the job up
    final = wait_for_state(job_id, env, {"STALLED", "FAILED", "SUCCEEDED"}, timeout=120)
    assert (final["state"], final["exit_code"]) == ("STALLED", 5), final["events"][-6:]
    assert "powered themselves off" in final["reason"]
    assert f"step ({step}) did not advance" in final["reason"]
    assert len(final["leases"]) == 2  # nothing launched again
