"""The node guard on `orch sandbox aws`: armed by cloud-init's user data at boot, it ends a hung
job's instances at max_runtime after its controller was killed, as EC2 ends an instance that
shuts itself down; the next orch command ends the job TIMED_OUT without launching again.
While the job runs, a second ledger under the same login reconciles the same account and leaves
the job's instances alone."""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import orch_env, run_orch
from tests.support.sandbox_run import SandboxProcess, aws_env
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.e2e

# Long enough that the second ledger's reconcile below, tens of seconds on a loaded machine,
# lists the job's instances before its max_runtime ends them.
MAX_RUNTIME = 40
GRACE = 3
HANG = (
    'python -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
    'time.sleep(100000)"'
)


def test_a_hung_job_ends_at_max_runtime_on_the_sandbox_without_its_controller(
    tmp_path: Path, sandbox: SandboxProcess
) -> None:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: hung\nworkdir: work\nrun: {HANG}\nresources: {{nodes: 2, gpus_per_node: 1}}\n"
        f"budget: {{max_runtime: {MAX_RUNTIME}}}\n"
    )
    home = tmp_path / "orch"
    env = orch_env(
        home, ORCH_STOP_GRACE=str(GRACE), ORCH_WATCH_INTERVAL="1", **aws_env(sandbox.endpoint)
    )
    result = run_orch(["submit", str(spec), "--provider", "aws", "--detach"], env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr + sandbox.output
    job_id = result.stdout.strip().splitlines()[-1]
    ledger = Ledger(make_engine(home / "orch.db"))
    wait_for_job(ledger, job_id, lambda job: job.state == "RUNNING", "RUNNING", 240)
    kinds = {e.kind: e.message for e in ledger.events(job_id)}
    assert "GUARDED" in kinds, kinds  # every node's guard runs and can power it off
    ids = [lease.instance_id for lease in ledger.leases(job_id)]
    theirs = orch_env(tmp_path / "other-orch", **aws_env(sandbox.endpoint))  # same login
    reconciled = run_orch(["reconcile", "--json"], theirs, timeout=120)
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    assert ledger.get_job(job_id).state == "RUNNING", "max_runtime came before the listing"
    assert sorted(json.loads(reconciled.stdout)["not_ours"]) == sorted(ids), reconciled.stdout
    os.kill(int((home / "jobs" / job_id / "controller.pid").read_text()), signal.SIGKILL)
    started = ledger.get_job(job_id).started_at
    assert started is not None

    ec2 = sandbox.ec2()

    def states() -> dict[str, dict]:
        reply = ec2.describe_instances(InstanceIds=ids)
        return {i["InstanceId"]: i for r in reply["Reservations"] for i in r["Instances"]}

    def ended() -> bool:
        names = [d["State"]["Name"] for d in states().values()]
        if all(name in ("shutting-down", "terminated") for name in names):
            return True
        waited = (datetime.now(UTC) - started).total_seconds()
        early = waited <= MAX_RUNTIME / 2 and any(name != "running" for name in names)
        assert not early, "an instance ended long before max_runtime"
        return False

    limit = MAX_RUNTIME + GRACE + 15 - (datetime.now(UTC) - started).total_seconds()
    wait_until(ended, "every instance shutting down", limit, interval=0.5)
    for desc in states().values():
        assert desc["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"

    run_orch(["reconcile"], env, timeout=120)
    final = ("TIMED_OUT", "FAILED", "SUCCEEDED")
    wait_for_job(ledger, job_id, lambda job: job.state in final, "the end", 120, interval=0.5)
    job = ledger.get_job(job_id)
    assert job.state == "TIMED_OUT", (job.state, job.reason)
    assert sorted(lease.instance_id for lease in ledger.leases(job_id)) == sorted(ids)
    assert all(lease.ended_at is not None for lease in ledger.leases(job_id))
