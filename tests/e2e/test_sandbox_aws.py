"""`orch submit --provider aws` end to end on `orch sandbox aws`: moto's EC2 on 127.0.0.1, and
namespace hosts with real sshd, rsync and torchrun (gloo on CPU) behind the instances."""

from __future__ import annotations

import json
import socket
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.sandbox.client import SandboxClient
from tests.support.helpers import (
    job_json,
    orch_env,
    processes_with_marker,
    run_orch,
    submitted_job_id,
)
from tests.support.sandbox_run import SandboxProcess, aws_env, bridge_exists, sandbox_namespaces

pytestmark = pytest.mark.e2e


@pytest.mark.soak  # `make test` keeps test_sandbox_spot.py, the same round trip plus a reclaim
def test_demo_job_round_trip_on_sandbox_spot_nodes(tmp_path: Path, sandbox: SandboxProcess) -> None:
    assert not sandbox_namespaces()
    env = orch_env(tmp_path / "orch", **aws_env(sandbox.endpoint))
    result = run_orch(
        ["submit", "templates/demo-ddp.yaml", "--nodes", "2", "--gpus", "2", "--provider", "aws",
         "--spot", "--yes"],
        env, timeout=400,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output + sandbox.output
    job_id = submitted_job_id(output)

    job = job_json(job_id, env)
    assert job["state"] == "SUCCEEDED" and job["provider"] == "aws"
    logs = tmp_path / "orch" / "jobs" / job_id / "logs"
    text = (logs / "node-0.log").read_text() + (logs / "node-1.log").read_text()
    for rank in range(4):
        assert f"trainer rank={rank} world_size=4" in text, text[-3000:]
    from orch_trainer.checkpoint import find_latest, load_state

    latest = find_latest(tmp_path / "orch" / "jobs" / job_id / "checkpoints")
    assert latest is not None and load_state(latest)["progress"]["step"] == job["step"] > 0

    # moto: both spot instances of the job are terminated, by orch (not reclaimed).
    ec2 = sandbox.ec2()
    reservations = ec2.describe_instances(Filters=[{"Name": "tag:orch-job", "Values": [job_id]}])[
        "Reservations"
    ]
    instances = {i["InstanceId"]: i for r in reservations for i in r["Instances"]}
    assert len(instances) == 2
    for desc in instances.values():
        assert desc["State"]["Name"] == "terminated"
        assert desc["StateReason"]["Code"] == "Client.UserInitiatedShutdown"
        assert desc["InstanceLifecycle"] == "spot"

    # The ledger: every lease closed, at the sandbox's spot price of the zone it ran in, from
    # the instance's LaunchTime; the spend is exactly seconds x that price.
    status = SandboxClient(sandbox.endpoint).status()
    spot = {(row["zone"], row["instance_type"]): Decimal(row["spot"]) for row in status["prices"]}
    leases = Ledger(make_engine(tmp_path / "orch" / "orch.db")).leases(job_id)
    assert {lease.instance_id for lease in leases} == set(instances)
    expected = Decimal(0)
    for lease in leases:
        desc = instances[lease.instance_id]
        assert lease.ended_at is not None and lease.market == "spot"
        zone = desc["Placement"]["AvailabilityZone"]
        assert lease.price_per_hour == spot[(zone, desc["InstanceType"])]
        assert lease.launched_at == desc["LaunchTime"]
        seconds = Decimal(str((lease.ended_at - lease.launched_at).total_seconds()))
        assert seconds > 0
        expected += seconds * lease.price_per_hour / Decimal(3600)
    assert job["spend_usd"] == float(expected)
    cost = run_orch(["cost", "--job", job_id, "--json"], env)
    assert cost.returncode == 0, cost.stderr
    assert json.loads(cost.stdout)["total_usd"] == float(expected)

    # The job's hosts are gone with their instances; the sandbox still runs.
    assert status["hosts"] == []
    for iid in instances:
        assert processes_with_marker(iid) == []
    assert not sandbox_namespaces()

    # SIGTERM: the sandbox removes everything it made and stops serving.
    assert sandbox.stop() == 0, sandbox.output
    assert "sandbox stopped: everything it made is removed" in sandbox.output
    assert not sandbox_namespaces() and not bridge_exists()
    assert processes_with_marker(str(sandbox.state_dir)) == []
    assert not sandbox.state_dir.exists()
    port = urlsplit(sandbox.endpoint).port
    assert port is not None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_sigterm_ends_hosts_that_are_still_running(tmp_path: Path, sandbox: SandboxProcess) -> None:
    env = orch_env(tmp_path / "orch", **aws_env(sandbox.endpoint))
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"  # still running when the sandbox stops, however slow the look
    spec.write_text("name: still-running\nworkdir: work\nrun: sleep 600\n")
    result = run_orch(
        ["submit", str(spec), "--nodes", "2", "--gpus", "1", "--provider", "aws",
         "--spot", "--detach", "--yes"],
        env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = submitted_job_id(result.stdout + result.stderr)
    from tests.support.helpers import wait_for_state

    wait_for_state(job_id, env, {"RUNNING"}, timeout=180)
    hosts = SandboxClient(sandbox.endpoint).status()["hosts"]
    assert len(hosts) == 2 and len(sandbox_namespaces()) == 2
    assert all(processes_with_marker(h["instance_id"]) for h in hosts)

    assert sandbox.stop() == 0, sandbox.output
    assert not sandbox_namespaces() and not bridge_exists()
    for host in hosts:
        assert processes_with_marker(host["instance_id"]) == []
    assert not sandbox.state_dir.exists()
