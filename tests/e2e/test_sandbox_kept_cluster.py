"""A kept cluster on `orch sandbox aws`: the second job runs on the first job's instances
(same EC2 ids, no second RunInstances), and once both are done and no orch process runs, the
instances' guards (armed by cloud-init) end the idle cluster at its autostop, as EC2 ends an
instance that shuts itself down."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.helpers import events, orch_env, run_orch
from tests.support.sandbox_run import SandboxProcess, aws_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

AUTOSTOP_S = 10


def test_two_jobs_share_kept_instances_and_the_idle_cluster_stops_itself_on_the_sandbox(
    tmp_path: Path, sandbox: SandboxProcess
) -> None:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: kept\nworkdir: work\nresources: {nodes: 2, gpus_per_node: 1}\n"
        "setup: echo ran >> ~/setup-runs.txt\nrun: echo step 1 loss 0.5\n"
        "budget: {max_runtime: 10m}\n"
    )
    env = orch_env(tmp_path / "orch", ORCH_WATCH_INTERVAL="1", **aws_env(sandbox.endpoint))
    flags = ["--provider", "aws", "--cluster", "dev", "--autostop", f"{AUTOSTOP_S}s"]
    jobs = []
    for _ in range(2):
        done = run_orch(["submit", str(spec), *flags, "--json"], env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr + sandbox.output
        jobs.append(json.loads(done.stdout))
    first, second = jobs
    ids = {lease["instance_id"] for lease in first["leases"]}
    assert {lease["instance_id"] for lease in second["leases"]} == ids
    assert not events(second, "LAUNCHED")
    assert "nothing launched" in events(second, "PROVISIONING")[0]["message"]

    ec2 = sandbox.ec2()
    assert len(ids) == 2
    ended_at = time.monotonic()

    def states() -> set[str]:
        reply = ec2.describe_instances(InstanceIds=sorted(ids))
        return {i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]}

    assert states() == {"running"}
    wait_until(
        lambda: not states() & {"pending", "running"}, "the idle cluster's autostop",
        AUTOSTOP_S + 90 - (time.monotonic() - ended_at), interval=1,
    )  # fmt: skip
    assert time.monotonic() - ended_at >= AUTOSTOP_S - 2  # not before its autostop

    # The next command asks EC2 and records the cluster DOWN where its instances ended.
    status = json.loads(run_orch(["status", "--json"], env, timeout=120).stdout)
    assert status["clusters"] == []
    bill = json.loads(run_orch(["cost", "--json"], env, timeout=120).stdout)
    (cluster,) = bill["clusters"]
    assert cluster["state"] == "DOWN", cluster
    assert "autostop" in cluster["reason"]
    assert cluster["jobs"] == [first["id"], second["id"]]
