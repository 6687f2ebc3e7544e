"""`orch controller up --provider aws` on `orch sandbox aws`: the host is an EC2 instance of
the sandbox with the controller host's instance profile; a job submitted with `--remote` is
launched by the host's orch through the sandbox's EC2 with the credentials the host's metadata
endpoint serves (the laptop's keys never reach it). The host is then terminated mid-job, its
own SQLite ledger with it: `orch controller up` launches a new host, which rebuilds the job from
the laptop's kit and the nodes' EC2 tags and adopts it on the same two nodes; it succeeds.
With no job left, the new host shuts itself down after its autostop (EC2 ends it), both host
lines of the bill are closed, and nothing is left."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import boto3
import pytest

from orchestrator.host import record as records
from orchestrator.host.layout import HostLayout
from orchestrator.host.session import HostSession
from orchestrator.ledger.store import HostLease, make_engine
from orchestrator.sandbox.client import SandboxClient
from tests.support.controller_host import cmdlines_with
from tests.support.helpers import HOLD_FILE, counter_run, counter_workdir, orch_env, run_orch
from tests.support.sandbox_run import SandboxProcess, aws_env, sandbox_namespaces
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

PROFILE = "orch-controller"
STEPS = 24
HOLD_AT = 4  # the run waits there until the new host has taken it over: it dies mid-job
AUTOSTOP_S = 30  # long enough for the laptop to hear the job end before the host does
# The laptop's own AWS credentials: any value does for the sandbox, and none may reach the host.
LAPTOP_KEYS = {
    "AWS_ACCESS_KEY_ID": "AKIALAPTOP7Q2W",
    "AWS_SECRET_ACCESS_KEY": "laptop-secret-9d41c7e2",
    "AWS_SESSION_TOKEN": "laptop-session-5b8e03aa",
    "AWS_PROFILE": "laptop-profile-3f1d",
}
WHO_AM_I = (
    "import boto3; c = boto3.Session().get_credentials(); "
    "print(c.method if c else 'none', c.access_key if c else '')"
)


def prepare_profile(sandbox: SandboxProcess) -> None:
    """What infra/ makes with `controller_host = true`: a role in an instance profile."""
    iam = boto3.client(
        "iam", endpoint_url=sandbox.endpoint, region_name="us-east-1",
        aws_access_key_id="sandbox", aws_secret_access_key="sandbox",
    )  # fmt: skip
    iam.create_role(RoleName=PROFILE, AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName=PROFILE)
    iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName=PROFILE)


def test_an_aws_host_drives_a_remote_job_with_its_own_credentials(
    tmp_path: Path, sandbox: SandboxProcess
) -> None:
    prepare_profile(sandbox)
    client = SandboxClient(sandbox.endpoint)
    sandbox_status = client.status()
    on_demand = sorted(sandbox_status["prices"], key=lambda r: Decimal(r["on_demand"]))
    host_type = on_demand[0]["instance_type"]
    home = tmp_path / "orch"
    laptop = {
        **aws_env(sandbox.endpoint),
        **LAPTOP_KEYS,
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
    }
    env = orch_env(
        home,
        **laptop,
        ORCH_AWS_CONTROLLER_INSTANCE_PROFILE=PROFILE,
        ORCH_AWS_CONTROLLER_ENDPOINT_URL=sandbox_status["host_endpoint"],
        ORCH_WATCH_INTERVAL="1",
        ORCH_HOST_TICK="2",
    )
    home.mkdir()
    (home / "config.yaml").write_text("aws: {poll_interval_s: 1}\n")  # the host gets it too
    # The laptop's profile and shared credentials file: boto3 here reads them, the host never.
    (tmp_path / "credentials").write_text(
        f"[{LAPTOP_KEYS['AWS_PROFILE']}]\n"
        f"aws_access_key_id = {LAPTOP_KEYS['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {LAPTOP_KEYS['AWS_SECRET_ACCESS_KEY']}\n"
    )

    up = run_orch(
        ["controller", "up", "--provider", "aws", "--instance-type", host_type,
         "--autostop", "0", "--json"],
        env, timeout=180,
    )  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr + sandbox.output[-3000:]
    record = records.load(home)
    assert record is not None and record.provider == "aws" and record.instance_id
    host_id = record.instance_id

    # The host: an on-demand instance of the sandbox with the profile, owned by no job.
    ec2 = sandbox.ec2()
    (desc,) = [i for r in ec2.describe_instances(InstanceIds=[host_id])["Reservations"]
               for i in r["Instances"]]  # fmt: skip
    tags = {t["Key"]: t["Value"] for t in desc["Tags"]}
    assert tags["orch-role"] == "controller-host" and "orch-job" not in tags, tags
    assert desc["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/{PROFILE}")
    assert desc.get("InstanceLifecycle") != "spot"
    # reconcile and `down --all` leave it alone
    assert run_orch(["reconcile"], env, timeout=60).returncode == 0
    assert ec2.describe_instances(InstanceIds=[host_id])["Reservations"][0]["Instances"][0][
        "State"]["Name"] == "running"  # fmt: skip

    # The host's orch resolves EC2 credentials from its metadata endpoint (the instance's).
    session = HostSession(home, record)
    layout = HostLayout(record.root)
    try:
        who = session.run(f'. {layout.env} && {layout.python} -c "{WHO_AM_I}"').stdout.split()
    finally:
        session.close()
    assert who[0] == "iam-role" and who[1].startswith("ASIASANDBOX"), who

    spec = tmp_path / "job.yaml"
    counter_workdir(tmp_path)
    spec.write_text(
        "name: host-aws\nworkdir: work\nresources: {nodes: 2, gpus_per_node: 1}\n"
        f"run: {counter_run(STEPS, step_s=0.5, hold_at=HOLD_AT)}\n"
    )
    submitted = run_orch(
        ["submit", str(spec), "--remote", "--provider", "aws", "--no-spot", "--yes"],
        env, timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]

    seen: list[str] = []

    def job_now() -> dict:
        for value in LAPTOP_KEYS.values():
            seen.extend(cmdlines_with(value))
        # `orch status` asks the host, busy adopting the job, for as long as orch itself lets
        # it (`HostJobs.describe`): on a loaded machine, once, over 60 s.
        result = run_orch(["status", job_id, "--json"], env, timeout=300)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    wait_until(lambda: job_now()["step"] == HOLD_AT, f"{job_id} trains on the host", 150,
               interval=1)  # fmt: skip

    # No laptop secret in the host's env file, its logs and ledger, or any process's argv.
    disk = sandbox.state_dir / "hosts" / host_id / "disk"
    host_root = disk / Path(record.root).name
    env_text = (host_root / "env").read_text()
    assert "AWS_" not in env_text.replace("ORCH_AWS_", ""), env_text
    files = [host_root / "env", host_root / "daemon.log", *(host_root / "home").rglob("*")]
    for path in (p for p in files if p.is_file()):
        data = path.read_bytes()
        for value in LAPTOP_KEYS.values():
            assert value.encode() not in data, f"{value} is in the host's {path}"

    def job_nodes() -> list[dict]:
        found = ec2.describe_instances(Filters=[{"Name": "tag:orch-job", "Values": [job_id]}])
        return [i for r in found["Reservations"] for i in r["Instances"]]

    nodes = {n["InstanceId"] for n in job_nodes()}
    assert len(nodes) == 2, nodes

    # The host dies mid-job, its own ledger with it; the next `up` replaces it, with an
    # autostop shorter than the hand-over may take (the host is busy while it lasts).
    ec2.terminate_instances(InstanceIds=[host_id])
    again = run_orch(
        ["controller", "up", "--provider", "aws", "--instance-type", host_type,
         "--autostop", f"{AUTOSTOP_S}s", "--json"],
        env, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr + sandbox.output[-3000:]
    replaced = json.loads(again.stdout)
    assert replaced["replaced"]["terminated"] == host_id, replaced
    assert replaced["rebuilt"] == [job_id] and replaced["lost"] == {}, json.dumps(replaced)
    new_host = replaced["instance_id"]
    assert new_host != host_id
    for node in nodes:  # the run goes on past its hold
        workdir = sandbox.state_dir / "hosts" / node / "disk" / "orch-jobs" / job_id / "workdir"
        assert workdir.is_dir(), workdir
        (workdir / HOLD_FILE).touch()

    def finished() -> dict | None:
        job = job_now()
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    job = wait_until(finished, f"{job_id} ends on the new host", timeout=180, interval=1)
    assert job["state"] == "SUCCEEDED", json.dumps(job.get("events"))[-3000:]
    assert job["provider"] == "aws" and job["step"] == STEPS and job["recoveries"] == 0, job
    kinds = [event["kind"] for event in job["events"]]
    assert kinds[:2] == ["REBUILT", "ADOPTED"], kinds
    # The same two nodes, rebuilt from their tags: no second cluster, none left running.
    assert {lease["instance_id"] for lease in job["leases"]} == nodes, job["leases"]
    ended = job_nodes()
    assert {n["InstanceId"] for n in ended} == nodes, ended
    assert all(n["State"]["Name"] == "terminated" for n in ended), ended
    assert seen == [], "a laptop secret appeared in a process's arguments"
    host_id = new_host

    # Once it has no job to drive, the new host shuts itself down: EC2 ends it.
    def self_ended() -> dict | None:
        (found,) = ec2.describe_instances(InstanceIds=[host_id])["Reservations"][0]["Instances"]
        return found if found["State"]["Name"] in ("shutting-down", "terminated") else None

    ended_host = wait_until(self_ended, "the idle host to end itself", AUTOSTOP_S + 60,
                            interval=1)  # fmt: skip
    assert ended_host["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown", ended_host
    status = run_orch(["controller", "status", "--json"], env, timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["billing_stopped_at"], status.stdout
    down = run_orch(["controller", "down", "--json"], env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    done = json.loads(down.stdout)
    assert done["terminated"] == host_id and done["billing_stopped_at"]

    from sqlmodel import Session, select

    with Session(make_engine(home / "orch.db")) as db:
        (lease,) = db.exec(select(HostLease).where(HostLease.instance_id == host_id)).all()
    assert lease.provider == "aws" and lease.ended_at is not None
    assert lease.price_per_hour == Decimal(on_demand[0]["on_demand"])
    with Session(make_engine(home / "orch.db")) as db:
        hosts = db.exec(select(HostLease)).all()
    assert len(hosts) == 2 and all(h.ended_at is not None for h in hosts), hosts
    # The sandbox ends a terminated instance's host on its next pass, not at once.
    wait_until(lambda: client.status()["hosts"] == [], "the sandbox to end every host")
    assert not sandbox_namespaces()
