"""A spot reclaim with notice on `orch sandbox aws`: the job's node 1 gets EC2's two-minute
warning (shortened) while the first zone has no spot capacity left, and the job must come back
in another zone from its emergency checkpoint and finish with nothing lost.

The job keeps its checkpoints in an S3 store of the sandbox's moto: the hosts upload with the
credentials their metadata endpoint serves for the instance profile orch attached, through the
sandbox's endpoint on the hosts' bridge, and the replacements download from it.

The same reclaim under the zone-aware deadline policy (`spot_policy: uniform-progress-mz`): the
policy, not the provider's fallback, chooses the next zone, says so in its POLICY events and
state, and the job stays on spot and meets its deadline."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import boto3
import pytest

from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.sandbox.client import SandboxClient
from tests.support.deadline_job import write_job
from tests.support.helpers import (
    REPO,
    assert_nothing_left,
    job_json,
    orch_env,
    processes_with_marker,
    run_orch,
)
from tests.support.sandbox_run import SandboxProcess, aws_env, sandbox_namespaces
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.e2e

CHECKPOINT_EVERY = 6
FAKE_SIZE = 6144  # 2 nodes x 2 ranks x batch 32: 48 steps per epoch
EPOCHS = 2
TARGET_STEPS = FAKE_SIZE // (2 * 2 * 32) * EPOCHS
NOTICE_S = 20
FIRST_ZONE, NEXT_ZONE = "us-east-1a", "us-east-1b"


BUCKET = "orch-sandbox-ckpt"
DATA_BUCKET = "orch-sandbox-data"
PROFILE = "orch-node"
DATASET = {f"ds/shard-{i}.txt": f"shard {i}\n".encode() * 1000 for i in range(5)}


def prepare_store(sandbox: SandboxProcess) -> None:
    """What infra/ makes with `checkpoint_store` set: the bucket, a role, its profile."""

    def client(service: str):  # noqa: ANN202
        return boto3.client(
            service, endpoint_url=sandbox.endpoint, region_name="us-east-1",
            aws_access_key_id="sandbox", aws_secret_access_key="sandbox",
        )  # fmt: skip

    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.create_bucket(Bucket=DATA_BUCKET)
    for key, body in DATASET.items():
        s3.put_object(Bucket=DATA_BUCKET, Key=key, Body=body)
    iam = client("iam")
    iam.create_role(RoleName=PROFILE, AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName=PROFILE)
    iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName=PROFILE)


def demo_job(tmp_path: Path) -> Path:
    """The demo job (templates/demo-ddp.yaml) with enough steps for a reclaim to land mid-run."""
    path = tmp_path / "demo-spot.yaml"
    path.write_text(
        "name: demo-spot\n"
        f"workdir: {REPO}\n"
        "run: >-\n"
        f"  python -m orch_trainer.train --model tiny --data fake --fake-size {FAKE_SIZE}\n"
        f"  --epochs {EPOCHS} --batch-size 32 --workers 0 --checkpoint-every {CHECKPOINT_EVERY}\n"
        "  --log-every 2\n"
        "resources: {nodes: 2, gpus_per_node: 2}\n"
        f"checkpoint: {{dir: ~/ckpt, pull_every: 2, store: 's3://{BUCKET}/runs'}}\n"
        "env: {OMP_NUM_THREADS: '1'}\n"
        # The hosts download a dataset with their role, and send it back as their outputs.
        f"data: [{{src: 's3://{DATA_BUCKET}/ds', dst: ~/ds}}]\n"
        f"outputs: [{{src: ~/ds, dst: 's3://{DATA_BUCKET}/results', nodes: all}}]\n"
    )
    return path


def wait_job(ledger: Ledger, job_id: str, predicate, what: str, timeout: float) -> Job:
    return wait_for_job(ledger, job_id, predicate, what, timeout, stop_at=("FAILED", "CANCELLED"))


def events(job: dict, kind: str) -> list[dict]:
    return [e for e in job["events"] if e["kind"] == kind]


def test_spot_reclaim_with_notice_resumes_in_another_zone_with_nothing_lost(
    tmp_path: Path, sandbox: SandboxProcess
) -> None:
    prepare_store(sandbox)
    env = orch_env(
        tmp_path / "orch",
        **aws_env(sandbox.endpoint),
        ORCH_WATCH_INTERVAL="1",
        ORCH_NOTICE_POLL_INTERVAL="1",
        ORCH_AWS_INSTANCE_PROFILE=PROFILE,
        ORCH_STORE_ENDPOINT_URL=sandbox.endpoint,
        ORCH_STORE_NODE_ENDPOINT_URL=SandboxClient(sandbox.endpoint).status()["host_endpoint"],
    )
    submitted = run_orch(
        ["submit", str(demo_job(tmp_path)), "--nodes", "2", "--gpus", "2", "--provider", "aws",
         "--spot", "--detach", "--yes"],
        env, timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    ledger = Ledger(make_engine(tmp_path / "orch" / "orch.db"))
    wait_job(ledger, job_id, lambda j: (j.step or 0) >= 8, "step 8", timeout=300)
    first = {lease.rank: lease.instance_id for lease in ledger.leases(job_id)}
    assert len(first) == 2
    client = SandboxClient(sandbox.endpoint)
    zone_of = {h["instance_id"]: h["zone"] for h in client.status()["hosts"]}
    assert {zone_of[iid] for iid in first.values()} == {FIRST_ZONE}

    # The first zone sells no more spot; then EC2 warns node 1.
    assert client.set_capacity([FIRST_ZONE], "spot", available=False)["refused"]
    step_at_notice = ledger.get_job(job_id).step or 0
    reclaimed = first[1]
    preempt = run_orch(
        ["sandbox", "preempt", reclaimed, "--notice", str(NOTICE_S), "--no-wait"], env, timeout=60
    )
    assert preempt.returncode == 0, preempt.stdout + preempt.stderr

    assert ledger.get_job(job_id).recoveries == 0  # the notice came mid-run
    wait_job(ledger, job_id, lambda j: j.state == "SUCCEEDED", "the end", timeout=400)
    job = job_json(job_id, env)
    assert job["step"] == TARGET_STEPS  # nothing lost: the run reached its last step
    assert job["recoveries"] == 1
    (noticed,) = events(job, "PREEMPTED")
    assert noticed["message"].startswith(f"notice: node 1 ({reclaimed})"), noticed
    # The emergency checkpoint was written at or after the step of the notice, and pulled ...
    (salvaged,) = events(job, "SALVAGED")
    assert salvaged["step"] is not None and salvaged["step"] >= step_at_notice, job["events"]
    pulled = {e["step"] for e in events(job, "CHECKPOINT")}
    assert salvaged["step"] in pulled
    # ... and the run resumed from it on the replacements, which downloaded it from S3.
    (resumed,) = events(job, "RESUMED")
    assert resumed["step"] == salvaged["step"], job["events"]
    assert f"step-{salvaged['step']:06d}" in resumed["message"]
    (restored,) = events(job, "RESTORED")
    assert "from the store to 2 node(s)" in restored["message"], job["events"]
    s3 = boto3.client("s3", endpoint_url=sandbox.endpoint, region_name="us-east-1",
                      aws_access_key_id="sandbox", aws_secret_access_key="sandbox")  # fmt: skip
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}
    stored = [c for c in job["checkpoints"] if c["stored"]]
    assert stored and all({f["key"] for f in c["files"]} <= keys for c in stored), stored
    assert all(key.startswith(f"runs/{job_id}/") for key in keys)
    # Every host fetched the dataset from the bucket with its role; the noticed node sent its
    # outputs within the notice, the replacements theirs at the end.
    fetched = [e["message"] for e in events(job, "DATA") if e["message"].startswith("data[0]")]
    assert fetched and all("5 object(s) on 2 node(s)" in m for m in fetched), job["events"]
    uploads = [e["message"] for e in events(job, "OUTPUTS")]
    assert any("node 1" in m and "uploaded 5 file(s)" in m and "(spot notice)" in m
               for m in uploads), uploads  # fmt: skip
    assert sum("(job succeeded)" in m and "uploaded 5 file(s)" in m for m in uploads) == 2
    results = s3.list_objects_v2(Bucket=DATA_BUCKET, Prefix="results/")["Contents"]
    assert {o["Key"] for o in results} == {
        f"results/node-{rank}/{key[3:]}" for rank in (0, 1) for key in DATASET
    }

    # Node 0 stayed while one replacement was asked of the first zone, which had no spot left:
    # then the whole cluster moved.
    (refused,) = [e for e in events(job, "WARNING") if "no capacity for the replacement" in
                  e["message"]]  # fmt: skip
    assert "the whole cluster moves" in refused["message"]
    # Four leases: the first two in the first zone, the replacements in the next one, each at
    # the sandbox's spot price of its zone.
    status = client.status()
    spot = {(row["zone"], row["instance_type"]): Decimal(row["spot"]) for row in status["prices"]}
    ec2 = sandbox.ec2()
    reservations = ec2.describe_instances(Filters=[{"Name": "tag:orch-job", "Values": [job_id]}])
    instances = {i["InstanceId"]: i for r in reservations["Reservations"] for i in r["Instances"]}
    leases = ledger.leases(job_id)
    assert len(leases) == 4 and {lease.instance_id for lease in leases} == set(instances)
    replacements = [lease for lease in leases if lease.instance_id not in first.values()]
    assert sorted(lease.rank for lease in replacements) == [0, 1]
    expected = Decimal(0)
    for lease in leases:
        desc = instances[lease.instance_id]
        zone = desc["Placement"]["AvailabilityZone"]
        assert zone == (NEXT_ZONE if lease in replacements else FIRST_ZONE)
        assert lease.market == "spot" and desc["InstanceLifecycle"] == "spot"
        assert lease.price_per_hour == spot[(zone, desc["InstanceType"])]
        assert lease.ended_at is not None and lease.launched_at == desc["LaunchTime"]
        expected += (
            Decimal(str((lease.ended_at - lease.launched_at).total_seconds()))
            * lease.price_per_hour
            / Decimal(3600)
        )
    assert job["spend_usd"] == float(expected)

    # moto: every instance is terminated, each launch call made one instance.
    assert {d["State"]["Name"] for d in instances.values()} == {"terminated"}
    tokens = Counter(
        t["Value"] for d in instances.values() for t in d["Tags"] if t["Key"] == "orch-launch-token"
    )
    assert len(tokens) == 4 and set(tokens.values()) == {1}, tokens
    reason = instances[reclaimed]["StateReason"]["Code"]
    # orch ends the interrupted run's nodes as soon as the checkpoint is safe, which may be
    # before the notice runs out; either way the node is gone.
    assert reason in ("Client.UserInitiatedShutdown", "Server.SpotInstanceTermination")
    client.wait_reclaimed(reclaimed, NOTICE_S + 30)
    # The sandbox ends a terminated instance's host on its next pass, not at once.
    wait_until(lambda: client.status()["hosts"] == [], "the sandbox to end every host")
    for iid in instances:
        assert processes_with_marker(iid) == []
    assert not sandbox_namespaces()


MZ_STEPS = 48  # 12 s of steps: the reclaim lands mid-run
MZ_DEADLINE_S = 900


def test_uniform_progress_mz_moves_the_job_to_the_zone_with_spot_on_a_reclaim(
    tmp_path: Path, sandbox: SandboxProcess
) -> None:
    """Two spot nodes in the cheapest zone; that zone sells no more spot and node 1 is
    reclaimed. The replacement is refused beside node 0, and the policy sends the whole job
    (its checkpoint with it) to the next zone's spot, not to on-demand."""
    env = orch_env(
        tmp_path / "orch", **aws_env(sandbox.endpoint), ORCH_WATCH_INTERVAL="1",
        ORCH_NOTICE_POLL_INTERVAL="1", ORCH_POLICY_INTERVAL="1",
    )  # fmt: skip
    policy_lines = f"deadline: {MZ_DEADLINE_S}s\nspot_policy: uniform-progress-mz\n"
    spec = write_job(tmp_path, "zones", MZ_STEPS, policy_lines)
    submitted = run_orch(
        ["submit", str(spec), "--nodes", "2", "--provider", "aws", "--detach", "--yes"], env,
        timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    ledger = Ledger(make_engine(tmp_path / "orch" / "orch.db"))
    wait_job(ledger, job_id, lambda j: (j.step or 0) >= 8, "step 8", timeout=120)
    first = {lease.rank: lease.instance_id for lease in ledger.leases(job_id)}
    client = SandboxClient(sandbox.endpoint)
    zone_of = {h["instance_id"]: h["zone"] for h in client.status()["hosts"]}
    assert {zone_of[iid] for iid in first.values()} == {FIRST_ZONE}  # the cheapest spot

    assert client.set_capacity([FIRST_ZONE], "spot", available=False)["refused"]
    client.preempt(first[1], 3)
    wait_job(ledger, job_id, lambda j: j.state == "SUCCEEDED", "the end", timeout=180)
    job = job_json(job_id, env)
    timeline = "\n".join(f"{e['at'][11:23]} {e['kind']} {e['message']}" for e in job["events"])

    # It met its deadline, with every step done, on spot only: two nodes in the first zone,
    # then two in the next one.
    created, ended = (datetime.fromisoformat(job[k]) for k in ("created_at", "ended_at"))
    assert ended <= created + timedelta(seconds=MZ_DEADLINE_S)
    assert job["step"] == MZ_STEPS and job["recoveries"] == 1, timeline
    leases = ledger.leases(job_id)
    ec2 = sandbox.ec2()
    described = ec2.describe_instances(InstanceIds=[lease.instance_id for lease in leases])
    zone = {
        i["InstanceId"]: i["Placement"]["AvailabilityZone"]
        for r in described["Reservations"]
        for i in r["Instances"]
    }
    assert [lease.market for lease in leases] == ["spot"] * 4, timeline
    assert [(zone[lease.instance_id], lease.rank) for lease in leases] == [
        (FIRST_ZONE, 0), (FIRST_ZONE, 1), (NEXT_ZONE, 0), (NEXT_ZONE, 1),
    ], timeline  # fmt: skip

    # The policy chose each zone, and said why; its state names the zone for a new controller.
    policy = [e["message"] for e in events(job, "POLICY")]
    assert policy[0].startswith(f"uniform-progress-mz: spot in {FIRST_ZONE} "), timeline
    moved = [m for m in policy if m.startswith(f"uniform-progress-mz: spot in {NEXT_ZONE} ")]
    assert len(moved) == 1 and f"none in {FIRST_ZONE}" in moved[0], timeline
    assert f"checkpoint in {FIRST_ZONE}" in moved[0], timeline
    assert not any("on-demand" in m.split("(")[0] for m in policy), timeline
    state = json.loads(ledger.get_job(job_id).policy_state or "{}")
    assert (state["market"], state["zone"], state["ran_in"]) == ("spot", NEXT_ZONE, NEXT_ZONE)
    assert any("no capacity for the replacement" in e["message"] for e in events(job, "WARNING"))
    # The checkpoint moved with the job: the run resumed from it in the next zone.
    (resumed,) = events(job, "RESUMED")
    assert resumed["step"] and resumed["step"] >= 8, timeline
    assert_nothing_left(job)
    client.wait_reclaimed(first[1], 30)
    # The sandbox ends a terminated instance's host on its next pass, not at once.
    wait_until(lambda: client.status()["hosts"] == [], "the sandbox to end every host")
