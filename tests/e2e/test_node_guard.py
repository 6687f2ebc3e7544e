"""The node guard: a job's limits hold when its controller is killed and no orch command runs.

Each test submits a job that never ends by itself (it ignores SIGTERM, as a hung NCCL job
does), kills the detached controller with SIGKILL once the job runs, and then only watches the
machine: the nodes must power themselves off within the bound each limit promises.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, lease_cost, make_engine
from tests.support.helpers import network_namespaces, orch_env, processes_with_marker, run_orch
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.e2e

HANG = (  # writes `hanging` in its workdir once past its start-up, then hangs
    'python -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
    "open('hanging', 'w').close(); time.sleep(100000)\""
)
GRACE = 3  # controller.stop_grace: SIGTERM, then this long, then SIGKILL


def submit_and_kill(tmp_path: Path, budget: str, **env_extra: str) -> tuple[Ledger, str, Path]:
    """Submit a hanging 2-node job detached, wait for RUNNING, SIGKILL its controller."""
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: hung\nworkdir: work\nrun: {HANG}\n"
        f"resources: {{nodes: 2, gpus_per_node: 1}}\nbudget: {budget}\n"
    )
    home = tmp_path / "orch"
    env = orch_env(home, ORCH_STOP_GRACE=str(GRACE), **env_extra)
    result = run_orch(["submit", str(spec), "--detach"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().splitlines()[-1]
    ledger = Ledger(make_engine(home / "orch.db"))
    wait_for_job(
        ledger, job_id, lambda job: job.state == "RUNNING", "RUNNING", 90,
        stop_at=("STOPPING", "FAILED", "SUCCEEDED", "CANCELLED", "TIMED_OUT"),
        fail=lambda said: AssertionError(f"{said}\n{ledger.events(job_id)}"),
    )  # fmt: skip
    pid = int((home / "jobs" / job_id / "controller.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # no orch command runs from here on
    return ledger, job_id, home


def node_left(home: Path, iid: str) -> bool:
    return bool(
        processes_with_marker(iid)
        or any(iid in ns for ns in network_namespaces())
        or (home / "local/nodes" / iid).exists()
    )


def wait_gone(home: Path, ids: list[str], limit_s: float, since: datetime) -> float:
    """Seconds from `since` until every node is gone; fails past `limit_s`."""
    wait_until(
        lambda: not any(node_left(home, iid) for iid in ids),
        "every node gone", limit_s - (datetime.now(UTC) - since).total_seconds(),
        interval=0.25, fail=lambda said: AssertionError(f"{said}\n{guard_logs(home)}"),
    )  # fmt: skip
    return (datetime.now(UTC) - since).total_seconds()


def guard_logs(home: Path) -> str:
    logs = sorted((home / "local/nodes").glob("*/disk/orch-jobs/*/guard/guard.log"))
    return "\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for log in logs)


def ended_at(home: Path, iid: str) -> datetime:
    """When billing of a guard-ended node stopped, as the local provider kept it."""
    return datetime.fromisoformat(
        json.loads((home / f"local/powered-off/{iid}.json").read_text())["at"]
    )


# `make test` keeps the same guard ending a hung job at max_runtime on the sandbox
# (test_sandbox_guard.py), and bench/guard_billing measures it here
@pytest.mark.soak
def test_max_runtime_ends_a_hung_job_without_its_controller(tmp_path: Path) -> None:
    max_runtime = 12
    ledger, job_id, home = submit_and_kill(
        tmp_path, f"{{max_runtime: {max_runtime}}}", ORCH_WATCH_INTERVAL="1"
    )
    job = ledger.get_job(job_id)
    assert job.started_at is not None
    ids = [lease.instance_id for lease in ledger.leases(job_id)]
    time.sleep(max_runtime / 2)  # the subject: half the runtime passes, the nodes stay up
    assert all(processes_with_marker(iid) for iid in ids), "a node ended before max_runtime"
    wait_gone(home, ids, max_runtime + GRACE + 15, job.started_at)
    for iid in ids:
        after = (ended_at(home, iid) - job.started_at).total_seconds()
        assert max_runtime <= after <= max_runtime + GRACE + 15


def test_a_budget_lease_ends_a_hung_job_at_its_cap(tmp_path: Path) -> None:
    # 2 nodes x $3.60/h = $0.002 per second: a $0.05 cap lasts 25 s.
    cap, budget_interval = Decimal("0.05"), 5.0
    ledger, job_id, home = submit_and_kill(
        tmp_path,
        f"{{max_cost_usd: {cap}}}",
        ORCH_WATCH_INTERVAL="1",
        ORCH_BUDGET_INTERVAL=str(budget_interval),
        ORCH_LOCAL_PRICE_PER_HOUR="3.6",
    )
    leases = ledger.leases(job_id)
    ids = [lease.instance_id for lease in leases]
    wait_gone(home, ids, 60, ledger.get_job(job_id).created_at)
    spend = sum(
        (lease_cost(lease, ended_at(home, lease.instance_id)) for lease in leases), Decimal(0)
    )
    one_lease_period = Decimal("3.6") * 2 * Decimal(str(budget_interval)) / 3600
    assert spend <= cap + one_lease_period, spend
    assert spend >= cap / 2, f"the nodes ended long before the budget was spent: ${spend}"


def hanging_since(home: Path, job_id: str, ids: list[str]) -> datetime:
    """When the run of every node got past its start-up (torchrun and python busy the CPU
    for seconds here) and began to hang: the newest of the nodes' `hanging` files."""
    files = [home / f"local/nodes/{iid}/disk/orch-jobs/{job_id}/workdir/hanging" for iid in ids]
    wait_until(lambda: all(f.exists() for f in files), "the runs' start", 60, interval=0.1)
    return datetime.fromtimestamp(max(f.stat().st_mtime for f in files), UTC)


def test_idle_nodes_end_without_their_controller(tmp_path: Path) -> None:
    """No nvidia-smi on these nodes: idleness is the job's CPU use, as the controller reads it."""
    idle_timeout, watch = 14, 2.0
    ledger, job_id, home = submit_and_kill(
        tmp_path, f"{{idle_timeout: {idle_timeout}}}", ORCH_WATCH_INTERVAL=str(watch)
    )
    ids = [lease.instance_id for lease in ledger.leases(job_id)]
    idle_from = hanging_since(home, job_id, ids)
    # Gone by the timeout + 2 watch intervals, + the SIGKILL grace that a job ignoring SIGTERM
    # costs, + the local poweroff's own time.
    wait_gone(home, ids, idle_timeout + 2 * watch + GRACE + 3, idle_from)
    for iid in ids:
        assert (ended_at(home, iid) - idle_from).total_seconds() >= idle_timeout


# `make test` keeps test_sandbox_guard.py's reconcile ending a guarded job TIMED_OUT
@pytest.mark.soak
def test_the_next_orch_command_ends_the_job_as_its_guard_did(tmp_path: Path) -> None:
    """Once the guard ended the nodes, a revived controller stops the job with the guard's
    reason and closes its leases at the nodes' own end: it launches nothing new."""
    ledger, job_id, home = submit_and_kill(tmp_path, "{max_runtime: 8}", ORCH_WATCH_INTERVAL="1")
    job = ledger.get_job(job_id)
    assert job.started_at is not None
    ids = [lease.instance_id for lease in ledger.leases(job_id)]
    wait_gone(home, ids, 8 + GRACE + 15, job.started_at)
    env = orch_env(home, ORCH_STOP_GRACE=str(GRACE), ORCH_WATCH_INTERVAL="1")
    run_orch(["reconcile"], env, timeout=120)
    ended = ("TIMED_OUT", "FAILED", "SUCCEEDED")
    wait_for_job(ledger, job_id, lambda job: job.state in ended, "the end", 120, interval=0.5)
    final = ledger.get_job(job_id)
    assert final.state == "TIMED_OUT", (final.state, final.reason)
    assert "powered themselves off" in (final.reason or "")
    leases = ledger.leases(job_id)
    assert sorted(lease.instance_id for lease in leases) == sorted(ids), "it launched again"
    for lease in leases:
        assert lease.ended_at == ended_at(home, lease.instance_id)
