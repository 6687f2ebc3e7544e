"""`orch sandbox aws` as orch's AWS provider sees it: a real sandbox process on 127.0.0.1, its
hosts reached over the sandbox bridge, its metadata read from inside a host's namespace."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import boto3
import pytest
from botocore.exceptions import ClientError

from orchestrator.cluster.connections import Cluster
from orchestrator.config import AwsSettings, Settings
from orchestrator.errors import ProviderError
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.ssh_banner import answers_ssh
from orchestrator.remote.keys import Identity, ensure_identity
from orchestrator.sandbox.client import SandboxClient
from tests.support.helpers import Background, orch_env, processes_with_marker, run_orch
from tests.support.sandbox_run import (
    SandboxProcess,
    aws_env,
    in_host,
    sandbox_namespaces,
    sandbox_turn,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

IMDS_READ = """
import json, urllib.error, urllib.request
open_url = urllib.request.build_opener(urllib.request.ProxyHandler({})).open
base = "http://169.254.169.254/latest/"
put = urllib.request.Request(base + "api/token", method="PUT",
                             headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
token = open_url(put, timeout=3).read().decode()
out = {}
for name in ("instance-id", "spot/instance-action"):
    get = urllib.request.Request(base + "meta-data/" + name,
                                 headers={"X-aws-ec2-metadata-token": token})
    try:
        with open_url(get, timeout=3) as reply:
            out[name] = [reply.status, reply.read().decode()]
    except urllib.error.HTTPError as exc:
        out[name] = [exc.code, ""]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with sandbox_turn():
        running = SandboxProcess(tmp_path_factory.mktemp("sandbox")).start()
        try:
            yield running
        finally:
            assert running.stop() == 0, running.output


@pytest.fixture
def aws(sandbox: SandboxProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The sandbox's environment for this test; every instance it launched ends after it."""
    env = aws_env(sandbox.endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield env
    ec2 = sandbox.ec2()
    live = [
        i["InstanceId"]
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] in ("pending", "running")
    ]
    if live:
        ec2.terminate_instances(InstanceIds=live)
    wait_until(lambda: not SandboxClient(sandbox.endpoint).status()["hosts"], "hosts ended")


def make_provider(home: Path, endpoint: str, **options: Any) -> AwsProvider:
    settings = {"endpoint_url": endpoint, "poll_interval_s": 0.2, "ready_timeout_s": 60}
    settings.update(options)
    return AwsProvider(Settings(home=home, aws=AwsSettings(**settings)))


def launch(
    provider: AwsProvider, identity: Identity, count: int, *, spot: bool = True, job: str = "sbx"
) -> list[Any]:
    return provider.launch(
        LaunchRequest(job_id=job, cluster=job, count=count, gpus_per_node=1,
                      public_key=identity.public_key, spot=spot, accelerator="A10G")
    )  # fmt: skip


def describe(sandbox: SandboxProcess, instance_id: str) -> dict:
    reply = sandbox.ec2().describe_instances(InstanceIds=[instance_id])
    return reply["Reservations"][0]["Instances"][0]


def host_gone(sandbox: SandboxProcess, instance_id: str) -> bool:
    return (
        "osbx-" + instance_id not in sandbox_namespaces()
        and processes_with_marker(instance_id) == []
        and not (sandbox.state_dir / "hosts" / instance_id).exists()
    )


def test_its_ec2_sells_the_price_table_on_its_own_network(
    sandbox: SandboxProcess, aws: dict[str, str]
) -> None:
    status = SandboxClient(sandbox.endpoint).status()
    assert status["zones"] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    table = {(row["zone"], row["instance_type"]): row for row in status["prices"]}
    ec2 = sandbox.ec2()
    history = ec2.describe_spot_price_history(
        InstanceTypes=["g5.xlarge"], ProductDescriptions=["Linux/UNIX"]
    )["SpotPriceHistory"]
    assert {(h["AvailabilityZone"], h["SpotPrice"]) for h in history} == {
        (zone, table[(zone, "g5.xlarge")]["spot"]) for zone in status["zones"]
    }
    on_demand = Decimal(table[("us-east-1a", "g5.xlarge")]["on_demand"])
    assert Decimal(table[("us-east-1a", "g5.xlarge")]["spot"]) == on_demand * Decimal("0.30")
    offered = ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["g5.xlarge", "p5.48xlarge"]}],
    )["InstanceTypeOfferings"]
    assert {o["Location"] for o in offered} == set(status["zones"])
    assert len(offered) == 6
    elsewhere = sandbox.ec2("us-east-2")  # the sandbox sells nothing outside its region
    prices = elsewhere.describe_spot_price_history(InstanceTypes=["g5.xlarge"])
    assert prices["SpotPriceHistory"] == []
    types = elsewhere.describe_instance_type_offerings(LocationType="availability-zone")
    assert types["InstanceTypeOfferings"] == []
    # The default VPC is the sandbox network; its subnets give no public IP.
    (vpc,) = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    assert vpc["CidrBlock"] == "10.214.0.0/16"
    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])
    assert {(s["AvailabilityZone"], s["CidrBlock"], s["MapPublicIpOnLaunch"])
            for s in subnets["Subnets"]} == {
        (zone, info["cidr"], False) for zone, info in status["subnets"].items()
    }  # fmt: skip
    # orch finds the image by its default name pattern, owned by Amazon.
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": [AwsSettings().ami_name]}]
    )["Images"]
    assert len(images) == 1


def test_its_sts_names_the_account_a_job_is_launched_as(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    identity = make_provider(tmp_path, sandbox.endpoint, regions=["us-east-1"]).identity()
    assert identity.account.isdigit() and len(identity.account) == 12
    assert (identity.region, identity.endpoint) == ("us-east-1", sandbox.endpoint)


def test_a_launched_node_is_a_host_orch_logs_into(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    provider = make_provider(tmp_path, sandbox.endpoint)
    identity = ensure_identity(tmp_path / "keys", "sbx")
    nodes = launch(provider, identity, 2)
    descs = [describe(sandbox, n.instance_id) for n in nodes]
    assert [d["State"]["Name"] for d in descs] == ["running", "running"]
    assert all("PublicIpAddress" not in d for d in descs)
    assert {d["Placement"]["AvailabilityZone"] for d in descs} == {"us-east-1a"}
    for node in nodes:
        assert node.ssh_host == node.private_ip and node.private_ip.startswith("10.214.1.")
        assert node.ssh_user == "ubuntu" and node.interface == "ens5"
        assert node.price_per_hour == Decimal("0.3018")  # g5.xlarge, spot, first zone
    cluster = Cluster(nodes, identity, connect_timeout=5)  # pins the user data's host keys
    try:
        for node, connection in zip(nodes, cluster.connections, strict=True):
            out = connection.run('echo "$USER $HOME"; ip -4 -o addr show dev ens5').stdout
            assert f"ubuntu {sandbox.state_dir / 'home'}" in out
            assert f"inet {node.private_ip}/16" in out
        cluster.connections[0].run("echo only-here > private.txt")
        assert cluster.connections[0].run("cat private.txt").stdout == "only-here\n"
        assert not cluster.connections[1].run("test -e private.txt", check=False).ok
        peer = nodes[1].private_ip
        reach = cluster.connections[0].run(
            f"python -c \"import socket; socket.create_connection(('{peer}', 22), 3)\"",
            check=False,
        )
        assert reach.ok, reach.tail()
        # its peer's address has a name, in the form a dual-stack listener sees it too, so
        # torch's c10d does not warn "The hostname of the client socket cannot be retrieved"
        named = cluster.connections[0].run(
            'python -c "import socket; '
            f"print(socket.getnameinfo(('::ffff:{peer}', 0), socket.NI_NAMEREQD)[0])\"",
            check=False,
        )
        assert named.ok and named.stdout.strip(), named.tail()
    finally:
        cluster.close()
    ended_at = provider.terminate([n.instance_id for n in nodes])
    assert ended_at.tzinfo is not None
    for node in nodes:
        wait_until(lambda node=node: host_gone(sandbox, node.instance_id), "host gone")
        reason = describe(sandbox, node.instance_id)["StateReason"]["Code"]
        assert reason == "Client.UserInitiatedShutdown"
    assert provider.preempted([n.instance_id for n in nodes]) == set()


def test_preempt_serves_the_notice_then_reclaims_the_node(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    provider = make_provider(tmp_path, sandbox.endpoint)
    (node,) = launch(provider, ensure_identity(tmp_path / "keys", "sbx"), 1)
    iid = node.instance_id
    before = json.loads(in_host(iid, IMDS_READ).stdout)
    assert before == {"instance-id": [200, iid], "spot/instance-action": [404, ""]}

    env = orch_env(tmp_path / "orch", **aws)
    notice_s = 15  # the looks below during the notice start Python, slow on a loaded machine
    preempt = Background(["sandbox", "preempt", iid, "--notice", str(notice_s)], env)
    preempt.wait_for("notice served", timeout=30)
    noticed = time.monotonic()
    during = json.loads(in_host(iid, IMDS_READ).stdout)
    assert during["instance-id"] == [200, iid]
    code, body = during["spot/instance-action"]
    assert code == 200
    notice = json.loads(body)
    assert notice["action"] == "terminate"
    left = (datetime.fromisoformat(notice["time"]) - datetime.now(UTC)).total_seconds()
    assert 0 < left <= notice_s + 1
    assert describe(sandbox, iid)["State"]["Name"] == "running"  # still up during the notice

    assert preempt.finish(timeout=60) == 0, preempt.output
    assert time.monotonic() - noticed >= notice_s - 1.5
    assert "reclaimed" in preempt.output
    desc = describe(sandbox, iid)
    assert desc["State"]["Name"] == "terminated"
    assert desc["StateReason"]["Code"] == "Server.SpotInstanceTermination"
    assert provider.preempted([iid]) == {iid}
    assert host_gone(sandbox, iid)
    reclaim = next(r for r in SandboxClient(sandbox.endpoint).status()["reclaims"]
                   if r["instance_id"] == iid)  # fmt: skip
    assert reclaim["done"] and reclaim["notice"] == notice


def test_a_zone_without_spot_capacity_sends_the_launch_to_the_next_zone(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    env = orch_env(tmp_path / "orch", **aws)
    refused = run_orch(["sandbox", "capacity", "us-east-1a"], env, timeout=60)
    assert refused.returncode == 0, refused.stderr
    assert "no spot capacity in us-east-1a" in refused.stdout
    subnet = SandboxClient(sandbox.endpoint).status()["subnets"]["us-east-1a"]["id"]
    ec2 = sandbox.ec2()
    spot = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
    with pytest.raises(ClientError) as caught:
        ec2.run_instances(ImageId="ami-0a1b2c3d4e5f60718", InstanceType="g5.xlarge", MinCount=1,
                          MaxCount=1, SubnetId=subnet, InstanceMarketOptions=spot)  # fmt: skip
    assert caught.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500  # as EC2 answers

    # EC2's 500 is a capacity refusal: one try, then the next zone (not botocore's retries).
    provider = make_provider(tmp_path, sandbox.endpoint, max_api_attempts=8)
    sent: list[str] = []
    provider.launch_client("us-east-1").meta.events.register(
        "before-send.ec2.RunInstances",
        lambda request, **_: sent.append(
            parse_qs(str(request.body))["Placement.AvailabilityZone"][0]
        ),
    )
    identity = ensure_identity(tmp_path / "keys", "sbx")
    (node,) = launch(provider, identity, 1)
    assert sent == ["us-east-1a", "us-east-1b"]
    assert describe(sandbox, node.instance_id)["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert node.price_per_hour == Decimal("0.3320")  # g5.xlarge spot in the second zone
    (on_demand,) = launch(provider, identity, 1, spot=False)  # on-demand still has room
    assert describe(sandbox, on_demand.instance_id)["Placement"]["AvailabilityZone"] == (
        "us-east-1a"
    )

    restored = run_orch(["sandbox", "capacity", "us-east-1a", "--restore"], env, timeout=60)
    assert restored.returncode == 0 and "every zone has capacity" in restored.stdout
    provider.terminate([node.instance_id, on_demand.instance_id])
    (again,) = launch(provider, identity, 1)
    assert describe(sandbox, again.instance_id)["Placement"]["AvailabilityZone"] == "us-east-1a"


class StateLog:
    """Polls the sandbox's instances in a thread: (state, does SSH answer) as seen over time."""

    def __init__(self, sandbox: SandboxProcess) -> None:
        self.ec2 = sandbox.ec2()
        self.seen: dict[str, set[tuple[str, bool]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> StateLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            for r in self.ec2.describe_instances()["Reservations"]:
                for i in r["Instances"]:
                    state, ip = i["State"]["Name"], i.get("PrivateIpAddress", "")
                    answers = state == "running" and answers_ssh(ip, 22, timeout_s=0.5)
                    self.seen.setdefault(i["InstanceId"], set()).add((state, answers))


def test_launch_returns_once_ssh_answers_not_when_ec2_says_running(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    env = orch_env(tmp_path / "orch", **aws)
    delay = 6
    said = run_orch(["sandbox", "boot", "--ssh-delay", str(delay)], env, timeout=60)
    assert said.returncode == 0, said.stderr
    assert f"running {delay} s before their sshd answers" in said.stdout
    identity = ensure_identity(tmp_path / "keys", "sbx")
    try:
        assert SandboxClient(sandbox.endpoint).status()["ssh_delay_s"] == delay
        # Taking `running` for "can log in" hands back a node whose sshd is not up yet ...
        eager = make_provider(tmp_path, sandbox.endpoint, wait_for_ssh=False)
        (early,) = launch(eager, identity, 1)
        assert describe(sandbox, early.instance_id)["State"]["Name"] == "running"
        assert not answers_ssh(early.ssh_host, 22)
        eager.terminate([early.instance_id])
        # ... the provider waits until the banner comes, however long after `running`.
        provider = make_provider(tmp_path, sandbox.endpoint)
        with StateLog(sandbox) as log:
            began = time.monotonic()
            (node,) = launch(provider, identity, 1)
            took = time.monotonic() - began
        assert answers_ssh(node.ssh_host, 22)
        assert ("running", False) in log.seen[node.instance_id], log.seen  # the knob holds sshd
        assert took >= delay - 0.5, took
        cluster = Cluster([node], identity, connect_timeout=30)  # a loaded machine is slow
        try:
            assert cluster.connections[0].run("echo up").stdout == "up\n"
        finally:
            cluster.close()

        # Bounded by the ready timeout: a clear error, and no node left running.
        hurried = make_provider(tmp_path, sandbox.endpoint, ready_timeout_s=3)
        with pytest.raises(ProviderError, match="SSH did not answer within 3 s") as caught:
            launch(hurried, identity, 1, job="hurried")
        assert "port 22 must be reachable" in (caught.value.hint or "")
        assert {n.instance_id for n in hurried.list_owned()} == {node.instance_id}
    finally:
        SandboxClient(sandbox.endpoint).set_boot(0)


def test_concurrent_calls_get_answers_not_server_errors(
    sandbox: SandboxProcess, aws: dict[str, str]
) -> None:
    """moto is not thread-safe; the sandbox serves many clients at once, as EC2 does."""
    from botocore.config import Config

    subnet = SandboxClient(sandbox.endpoint).status()["subnets"]["us-east-1b"]["id"]
    failures: list[str] = []
    launched: list[str] = []
    stop = threading.Event()

    def client() -> Any:
        return boto3.client(
            "ec2", region_name="us-east-1", endpoint_url=sandbox.endpoint,
            aws_access_key_id="sandbox", aws_secret_access_key="sandbox",
            config=Config(retries={"total_max_attempts": 1}),
        )  # fmt: skip

    def describe() -> None:
        ec2 = client()
        while not stop.is_set():
            try:
                ec2.describe_instances()
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                failures.append(repr(exc)[:200])

    def launch_some() -> None:
        ec2 = client()
        for _ in range(3):
            try:
                reply = ec2.run_instances(
                    ImageId="ami-0a1b2c3d4e5f60718", InstanceType="g5.xlarge", MinCount=1,
                    MaxCount=1, SubnetId=subnet,
                )  # fmt: skip
                launched.append(reply["Instances"][0]["InstanceId"])
            except Exception as exc:  # noqa: BLE001
                failures.append(repr(exc)[:200])

    readers = [threading.Thread(target=describe) for _ in range(4)]
    writers = [threading.Thread(target=launch_some) for _ in range(3)]
    for thread in readers + writers:
        thread.start()
    for thread in writers:
        thread.join(60)
    stop.set()
    for thread in readers:
        thread.join(60)
    assert failures == [] and len(launched) == 9


def test_mistakes_are_refused_with_a_reason(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    env = orch_env(tmp_path / "orch", **aws)
    unknown = run_orch(["sandbox", "preempt", "i-0000000000000dead", "--notice", "1"], env)
    assert unknown.returncode == 3 and "no running sandbox instance" in unknown.stderr
    zone = run_orch(["sandbox", "capacity", "eu-west-1a"], env)
    assert zone.returncode == 3 and "unknown zone" in zone.stderr
    no_endpoint = run_orch(["sandbox", "status"], orch_env(tmp_path / "orch"))
    assert no_endpoint.returncode == 2 and "ORCH_AWS_ENDPOINT_URL" in no_endpoint.stderr
    second = run_orch(["sandbox", "aws", "--port", "0"], orch_env(tmp_path / "other"), timeout=60)
    assert second.returncode == 3 and "another orch sandbox runs" in second.stderr
    assert SandboxClient(sandbox.endpoint).status()["endpoint"] == sandbox.endpoint  # unharmed


def test_a_host_pulls_a_private_image_from_the_gateway_and_runs_it_on_its_network(
    sandbox: SandboxProcess, aws: dict[str, str], tmp_path: Path
) -> None:
    """A sandbox host runs a job's image as a local node does (podman in its own namespaces):
    orch's pull script logs in to a registry at the bridge's gateway and pulls, a container on
    the host's network runs in the image; once the host ends, this machine is as it was."""
    from orchestrator.config import LocalSettings
    from orchestrator.node.container import (
        INNER_SCRIPT,
        ContainerLaunch,
        PullPlan,
        PullProgress,
        container_lines,
        pull_script,
    )
    from orchestrator.providers.aws.container_runtime import LOCAL_CLOUD_RUNROOT
    from orchestrator.sandbox.network import SandboxNetwork
    from tests.support.containers import (
        MARKER,
        host_state,
        offline_image,
        push_image,
        running_registry,
    )

    image = offline_image()
    before = host_state()
    gateway = str(SandboxNetwork().gateway)  # where the sandbox serves the hosts' S3 too
    with running_registry(gateway) as registry:
        ref = push_image(image, registry, "team/train")
        settings = Settings(
            home=tmp_path, aws=AwsSettings(endpoint_url=sandbox.endpoint, poll_interval_s=0.2,
                                           ready_timeout_s=60),
            local=LocalSettings(insecure_registries=[registry.address]),
        )  # fmt: skip
        provider = AwsProvider(settings)
        identity = ensure_identity(tmp_path / "keys", "sbx")
        (node,) = launch(provider, identity, 1)
        runtime = node.container_runtime
        assert runtime is not None and runtime.kind == "podman"
        cluster = Cluster([node], identity, connect_timeout=5)
        try:
            (connection,) = cluster.connections
            plan = PullPlan(image=ref, registry=registry.address, runtime=runtime,
                            auth_dir='"$HOME"/.orch-auth', username=registry.user)  # fmt: skip
            pulled = connection.run(pull_script(plan), stdin=registry.password + "\n",
                                    check=False, timeout=120)  # fmt: skip
            progress = PullProgress()
            for line in pulled.stdout.splitlines():
                progress.feed(line)
            assert pulled.ok and progress.pulled and progress.failure is None, pulled.tail()
            container = ContainerLaunch(image=ref, runtime=runtime, name="orch-sbx-r0-s0",
                                        mounts=['"$run_dir"'])  # fmt: skip
            script = "\n".join([
                'run_dir="$HOME"/orch-run; finish() { exit "$1"; }', 'mkdir -p "$run_dir"',
                f"echo 'cat {MARKER}; grep -c ens5: /proc/net/dev' > \"$run_dir/{INNER_SCRIPT}\"",
                *container_lines(container, '"$run_dir"'),
            ])  # fmt: skip
            inside = connection.run(script, check=False, timeout=60)
            assert inside.ok, inside.tail()
            assert inside.stdout.split() == [image.key, "1"]  # the image's, the host's NIC
        finally:
            cluster.close()
        provider.terminate([node.instance_id])
        wait_until(lambda: host_gone(sandbox, node.instance_id), "host gone")
    assert host_state() == before
    assert not any(Path(LOCAL_CLOUD_RUNROOT).iterdir())  # the host's state was on its own tmpfs
