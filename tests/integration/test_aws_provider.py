"""The AWS provider against a moto EC2 server on 127.0.0.1, through a real boto3 client: what a
launch makes (tags, market, zone, user data, volumes, security group, instance profile), zone
failover on capacity refusals, listing, preemption and reconcile. The moto facts these rely on
are in tests/support/aws_moto.py; the RunInstances retries are in test_aws_launch_retries.py.
`wait_for_ssh` is tested on `orch sandbox aws`, whose instances are real hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import AwsSettings, Settings
from orchestrator.errors import CapacityError
from orchestrator.providers import get_provider
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import Provider
from tests.support.aws_moto import (  # noqa: F401  (the fixture)
    PUBLIC_KEY,
    REGION,
    make_provider,
    moto_provider,
    provider_query,
    refuse,
    request,
    running,
)

pytestmark = pytest.mark.timeout(60)


def test_registry_builds_aws_provider_without_io(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, aws=AwsSettings(endpoint_url="http://127.0.0.1:9"))
    provider = get_provider("aws", settings)
    assert isinstance(provider, Provider) and provider.name == "aws"


@pytest.mark.parametrize("spot", [True, False])
def test_launch_tags_market_ips_one_zone_then_terminate(provider: AwsProvider, spot: bool) -> None:
    nodes = provider.launch(request(spot=spot))
    assert [n.rank for n in nodes] == [0, 1]
    market = "spot" if spot else "on-demand"
    descs = {d["InstanceId"]: d for d in running(provider)}
    assert set(descs) == {n.instance_id for n in nodes}
    zones = {d["Placement"]["AvailabilityZone"] for d in descs.values()}
    assert len(zones) == 1
    for node in nodes:
        desc = descs[node.instance_id]
        tags = {t["Key"]: t["Value"] for t in desc["Tags"]}
        assert tags["orch-job"] == "job1" and tags["orch-cluster"] == "job1"
        assert tags["orch-node-rank"] == str(node.rank) and tags["orch-owner"] == "tester"
        assert node.market == market and tags["orch-market"] == market
        assert (desc.get("InstanceLifecycle") == "spot") is spot
        assert node.instance_type == desc["InstanceType"] == "g5.xlarge"
        assert node.private_ip == desc["PrivateIpAddress"]
        assert node.ssh_host == desc["PublicIpAddress"]
        assert node.host_key.startswith("ssh-ed25519 ")
        assert node.ssh_user == "ubuntu" and node.interface == "ens5"
        expected = "0.00001" if spot else "1.006"
        assert str(node.price_per_hour) == expected
        volumes = provider.client(REGION).describe_volumes(
            Filters=[{"Name": "attachment.instance-id", "Values": [node.instance_id]}]
        )["Volumes"]
        assert volumes and all(
            {"Key": "orch-job", "Value": "job1"} in v.get("Tags", []) for v in volumes
        )
    assert {n.instance_id for n in provider.list_owned(job_id="job1")} == set(descs)
    ended = provider.terminate([n.instance_id for n in nodes])
    assert ended.tzinfo is not None
    assert running(provider) == [] and provider.list_owned() == []
    provider.terminate([n.instance_id for n in nodes])  # idempotent


def test_user_data_carries_host_key_and_client_key(provider: AwsProvider) -> None:
    import base64
    import gzip
    import json

    (node,) = provider.launch(request(count=1))
    raw = provider.client(REGION).describe_instance_attribute(
        InstanceId=node.instance_id, Attribute="userData"
    )["UserData"]["Value"]
    sent = base64.b64decode(raw)
    assert len(sent) <= 16384  # EC2's limit, on what is sent: gzipped, cloud-init unpacks it
    text = gzip.decompress(sent).decode()
    assert text.startswith("#cloud-config\n")
    doc = json.loads(text.split("\n", 1)[1])
    assert doc["ssh_keys"]["ed25519_public"] == node.host_key
    assert "OPENSSH PRIVATE KEY" in doc["ssh_keys"]["ed25519_private"]
    assert doc["ssh_authorized_keys"] == [PUBLIC_KEY] and doc["ssh_deletekeys"] is True


def test_a_cloud_on_this_machine_installs_nothing_for_a_container_and_offers_podman(
    provider: AwsProvider,
) -> None:
    """moto's and the sandbox's hosts are this machine: the boot setup would install packages
    on it, and its Docker runs in this machine's network, not the host's; the hosts run podman
    in their own namespaces instead, as local nodes do."""
    import base64
    import gzip

    (node,) = provider.launch(request(count=1, container=True))
    raw = provider.client(REGION).describe_instance_attribute(
        InstanceId=node.instance_id, Attribute="userData"
    )["UserData"]["Value"]
    assert "orch-container" not in gzip.decompress(base64.b64decode(raw)).decode()
    assert node.container_runtime is not None and node.container_runtime.kind == "podman"
    assert "--runroot /run/orch-sandbox-podman" in node.container_runtime.command
    owned = provider.list_owned(job_id="job1")
    assert owned and all(n.container_runtime == node.container_runtime for n in owned)


def test_capacity_error_fails_over_to_next_zone(provider: AwsProvider) -> None:
    first_zone = provider.offers(provider_query())[0].zone
    provider.launch_client(REGION).meta.events.register(
        "before-parameter-build.ec2.RunInstances",
        refuse(
            "InsufficientInstanceCapacity",
            lambda p: p["Placement"]["AvailabilityZone"] == first_zone,
        ),
    )
    nodes = provider.launch(request())
    zones = {d["Placement"]["AvailabilityZone"] for d in running(provider)}
    assert len(nodes) == 2 and len(zones) == 1 and first_zone not in zones


def test_a_recovery_launch_tries_the_interrupted_zone_last(provider: AwsProvider) -> None:
    first_zone = provider.offers(provider_query())[0].zone
    nodes = provider.launch(request(avoid_zones=(first_zone,), attempt=1))
    zones = {d["Placement"]["AvailabilityZone"] for d in running(provider)}
    assert len(zones) == 1 and first_zone not in zones
    assert {n.zone for n in nodes} == zones


def test_partial_launch_is_terminated_before_failover(provider: AwsProvider) -> None:
    first_zone = provider.offers(provider_query())[0].zone
    calls: list[str] = []

    def second_node_in_first_zone(params: dict) -> bool:
        zone = params["Placement"]["AvailabilityZone"]
        calls.append(zone)
        return zone == first_zone and calls.count(first_zone) == 2

    provider.launch_client(REGION).meta.events.register(
        "before-parameter-build.ec2.RunInstances",
        refuse("InsufficientInstanceCapacity", second_node_in_first_zone),
    )
    nodes = provider.launch(request())
    assert running(provider, **{"availability-zone": first_zone}) == []
    assert {d["InstanceId"] for d in running(provider)} == {n.instance_id for n in nodes}
    assert len(calls) == 4  # node 0 and 1 in the first zone, then both in the next


def test_everything_refused_is_a_capacity_error_listing_tries(provider: AwsProvider) -> None:
    provider.launch_client(REGION).meta.events.register(
        "before-parameter-build.ec2.RunInstances", refuse("SpotMaxPriceTooLow", lambda p: True)
    )
    with pytest.raises(CapacityError) as caught:
        provider.launch(request(count=1))
    message = str(caught.value)
    offers = provider.offers(provider_query())
    assert message.count("SpotMaxPriceTooLow") == len(offers) > 1
    assert all(o.zone in message for o in offers)
    assert running(provider) == []
    assert caught.value.exit_code == 3


def test_nothing_fits_is_a_capacity_error(provider: AwsProvider) -> None:
    from decimal import Decimal

    with pytest.raises(CapacityError, match="no AWS offer fits"):
        provider.launch(request(spot=False, max_price_per_hour=Decimal("0.5")))


def test_spot_reclaim_is_reported_as_preemption(provider: AwsProvider) -> None:
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    reclaimed, kept = provider.launch(request())
    instance = ec2_backends[DEFAULT_ACCOUNT_ID][REGION].get_instance(reclaimed.instance_id)
    instance.terminate()
    instance.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination",
    )
    ids = [reclaimed.instance_id, kept.instance_id]
    assert provider.preempted(ids) == {reclaimed.instance_id}
    provider.terminate([kept.instance_id])  # ended by orch: not a preemption
    assert provider.preempted(ids) == {reclaimed.instance_id}
    assert provider.list_owned() == []


def test_list_owned_finds_orphans_and_ignores_untagged(provider: AwsProvider) -> None:
    ec2 = provider.client(REGION)
    image = ec2.describe_images()["Images"][0]["ImageId"]

    def start(tags: dict[str, str]) -> str:
        args: dict[str, Any] = {"ImageId": image, "MinCount": 1, "MaxCount": 1}
        if tags:
            args["TagSpecifications"] = [
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ]
        return ec2.run_instances(**args)["Instances"][0]["InstanceId"]

    ghost = start({"orch-job": "ghost", "orch-ledger": "aaaa"})
    untagged = start({})
    foreign = start({"orch-job": "theirs", "orch-owner": "someone-else"})
    owned = provider.list_owned()  # every orch node, whoever's: the ledger tag says whose
    assert [(n.instance_id, n.job_id, n.ledger_id) for n in owned] == [
        (ghost, "ghost", "aaaa"),
        (foreign, "theirs", None),
    ]
    provider.terminate([ghost])
    assert {d["InstanceId"] for d in running(provider)} == {untagged, foreign}


def test_reconcile_terminates_ghost_and_leaves_untagged(provider: AwsProvider) -> None:
    from orchestrator.control.repair.reconcile import reconcile
    from orchestrator.ledger.store import Ledger, make_engine

    ec2 = provider.client(REGION)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ledger = Ledger(make_engine(provider.settings.db_path))

    def start(tags: dict[str, str]) -> str:
        spec = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
        reply = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=spec)
        return reply["Instances"][0]["InstanceId"]

    ghost = start({"orch-job": "ghost", "orch-ledger": ledger.ledger_id})
    no_ledger = start({"orch-job": "ghost"})  # an orch node no ledger tag claims: not ours
    untagged = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]
    report = reconcile(provider.settings, ledger, [provider])
    assert report.terminated == {"ghost": [ghost]}
    assert report.not_ours == [no_ledger]
    assert {d["InstanceId"] for d in running(provider)} == {untagged["InstanceId"], no_ledger}


def test_reconcile_bills_the_nodes_of_a_launch_cut_short(provider: AwsProvider) -> None:
    """A controller killed between a launch and its leases leaves nodes that bill off the
    books: reconcile ends them and puts their seconds on their job's bill."""
    from orchestrator.control.repair.reconcile import reconcile
    from orchestrator.job_state import JobState
    from orchestrator.ledger.store import Job, Ledger, make_engine, utcnow

    ledger = Ledger(make_engine(provider.settings.db_path))
    ledger.add_job(
        Job(id="job1", name="job1", state=JobState.FAILED, provider="aws", nodes=2,
            gpus_per_node=1, spec_json="{}", spec_path="job.yaml", created_at=utcnow(),
            ended_at=utcnow(), exit_code=1)
    )  # fmt: skip
    nodes = {n.instance_id: n for n in provider.launch(request(ledger_id=ledger.ledger_id))}
    # a job the ledger never knew
    (ghost,) = provider.launch(request(job="ghost", count=1, ledger_id=ledger.ledger_id))
    report = reconcile(provider.settings, ledger, [provider])
    assert report.terminated == {"job1": sorted(nodes), "ghost": [ghost.instance_id]}
    assert running(provider) == []
    leases = ledger.leases("job1")
    assert {lease.instance_id for lease in leases} == set(nodes)
    for lease in leases:
        node = nodes[lease.instance_id]
        assert lease.launched_at == node.launched_at and lease.ended_at is not None
        assert lease.price_per_hour == node.price_per_hour and lease.rank == node.rank
        assert lease.provider == "aws" and lease.market == "spot"
    assert [e.kind for e in ledger.events("job1")] == ["LEASED", "LEASED", "TERMINATED"]
    assert ledger.leases("ghost") == []
    again = reconcile(provider.settings, ledger, [provider])  # idempotent
    assert again.terminated == {} and len(ledger.leases("job1")) == 2


def test_terraform_outputs_pick_the_network(provider: AwsProvider, tmp_path: Path) -> None:
    import json

    ec2 = provider.client(REGION)
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    zone = "us-east-1b"
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.1.0/24", AvailabilityZone=zone)
    group = ec2.create_security_group(GroupName="tf-orch", Description="tf", VpcId=vpc)
    ec2.import_key_pair(KeyName="tf-key", PublicKeyMaterial=PUBLIC_KEY.encode())
    outputs = {
        "region": {"value": REGION},
        "key_name": {"value": "tf-key"},
        "security_group_id": {"value": group["GroupId"]},
        "subnet_ids": {"value": {zone: subnet["Subnet"]["SubnetId"]}},
    }
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    tf_provider = make_provider(
        tmp_path, provider.aws.endpoint_url or "", tf_outputs=path, regions=["us-west-2"]
    )
    nodes = tf_provider.launch(request())
    descs = running(tf_provider)
    assert {d["SubnetId"] for d in descs} == {subnet["Subnet"]["SubnetId"]}
    assert {d["KeyName"] for d in descs} == {"tf-key"}
    assert all(n.private_ip.startswith("10.77.1.") for n in nodes)


def test_hosts_of_a_cloud_on_this_machine_never_run_shutdown(provider: AwsProvider) -> None:
    """moto and `orch sandbox aws` hosts share this machine: the dead-man switch must not
    shut the machine down through them."""
    (node,) = provider.launch(request(count=1))
    assert "shutdown" not in node.poweroff_command
    assert all("shutdown" not in n.poweroff_command for n in provider.list_owned())


def test_nodes_of_a_job_with_a_store_get_the_instance_profile(
    tmp_path: Path, moto_endpoint: str
) -> None:
    import boto3

    iam = boto3.client("iam", endpoint_url=moto_endpoint, region_name=REGION)
    iam.create_role(RoleName="orch-node", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="orch-node")
    iam.add_role_to_instance_profile(InstanceProfileName="orch-node", RoleName="orch-node")
    provider = make_provider(tmp_path, moto_endpoint, instance_profile="orch-node")
    (with_store,) = provider.launch(request(job="stored", count=1, store="s3://b/p"))
    (with_data,) = provider.launch(request(job="data", count=1, buckets=True))
    (plain,) = provider.launch(request(job="plain", count=1))
    descs = {d["InstanceId"]: d for d in running(provider)}
    assert descs[with_store.instance_id]["IamInstanceProfile"]["Arn"].endswith("/orch-node")
    # Bucket data and outputs go with a role too, never with the user's keys.
    assert descs[with_data.instance_id]["IamInstanceProfile"]["Arn"].endswith("/orch-node")
    assert with_data.credentials
    assert "IamInstanceProfile" not in descs[plain.instance_id]
    assert with_store.credentials and not plain.credentials
    assert with_store.region == REGION
    (adopted,) = provider.list_owned(job_id="stored")
    assert adopted.credentials and adopted.region == REGION


def test_a_store_without_an_instance_profile_launches_nothing(provider: AwsProvider) -> None:
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError, match="no instance profile is configured") as caught:
        provider.launch(request(store="s3://b/p"))
    assert "instance_profile" in (caught.value.hint or "")
    with pytest.raises(ConfigError, match="reads s3:// data or writes outputs") as caught:
        provider.launch(request(buckets=True))
    assert "data_sources" in (caught.value.hint or "")
    assert running(provider) == []


def _root_volume(provider: AwsProvider, desc: dict) -> dict:
    root = desc["RootDeviceName"]
    [mapping] = [m for m in desc["BlockDeviceMappings"] if m["DeviceName"] == root]
    volume_id = mapping["Ebs"]["VolumeId"]
    [volume] = provider.client(REGION).describe_volumes(VolumeIds=[volume_id])["Volumes"]
    return volume


def test_nodes_require_imdsv2_and_boot_from_an_encrypted_root_volume(
    provider: AwsProvider,
) -> None:
    (node,) = provider.launch(request(count=1))
    (sized,) = provider.launch(request(job="sized", count=1, disk_size_gb=120))
    descs = {d["InstanceId"]: d for d in running(provider)}
    for instance in (node, sized):
        desc = descs[instance.instance_id]
        options = desc["MetadataOptions"]
        assert options["HttpTokens"] == "required" and options["HttpEndpoint"] == "enabled"
        assert options["HttpPutResponseHopLimit"] == 2
        volume = _root_volume(provider, desc)
        assert volume["Encrypted"] is True and volume["VolumeType"] == "gp3"
        [root] = [m for m in desc["BlockDeviceMappings"] if m["DeviceName"] == "/dev/sda1"]
        assert root["Ebs"]["DeleteOnTermination"] is True
    assert _root_volume(provider, descs[sized.instance_id])["Size"] == 120


def test_a_root_volume_smaller_than_the_image_launches_nothing(provider: AwsProvider) -> None:
    from orchestrator.errors import ConfigError

    # moto's images have a 15 GB root snapshot
    with pytest.raises(ConfigError, match="disk_size_gb is 10 GB, smaller than the 15 GB") as err:
        provider.launch(request(count=1, disk_size_gb=10))
    assert "at least 15" in (err.value.hint or "")
    assert running(provider) == []
    (node,) = provider.launch(request(count=1))  # no size asked: the image's own
    [desc] = running(provider)
    assert desc["InstanceId"] == node.instance_id and _root_volume(provider, desc)["Size"] == 15


def _orch_group(provider: AwsProvider) -> dict:
    [group] = provider.client(REGION).describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["orch"]}]
    )["SecurityGroups"]
    return group


def _ingress(group: dict) -> set[tuple]:
    rules = set()
    for p in group["IpPermissions"]:
        ports = (p["IpProtocol"], p.get("FromPort"), p.get("ToPort"))
        rules |= {(*ports, r["CidrIp"]) for r in p.get("IpRanges", [])}
        rules |= {(*ports, r["CidrIpv6"]) for r in p.get("Ipv6Ranges", [])}
        rules |= {(ports[0], g["GroupId"]) for g in p.get("UserIdGroupPairs", [])}
    return rules


def test_an_existing_orch_group_open_to_the_world_is_set_right_on_launch(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """Rules that are no owner's (SSH from anywhere, a port opened by hand, all traffic between
    members as an older orch allowed it) are revoked; the owner's SSH rule and SSH between
    members are added."""
    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    ec2 = provider.client(REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    group = ec2.create_security_group(GroupName="orch", Description="old", VpcId=vpc["VpcId"])
    ec2.authorize_security_group_ingress(
        GroupId=group["GroupId"],
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
             "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
            {"IpProtocol": "tcp", "FromPort": 8888, "ToPort": 8888,
             "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group["GroupId"]}]},
        ],
    )  # fmt: skip
    (node,) = provider.launch(request(count=1))
    groups = {g["GroupId"] for g in running(provider)[0]["SecurityGroups"]}
    assert group["GroupId"] in groups
    assert _ingress(_orch_group(provider)) == {
        ("tcp", 22, 22, "198.51.100.7/32"),
        ("tcp", group["GroupId"]),
    }


def test_without_ssh_cidr_a_cloud_on_this_machine_lets_in_only_this_machine(
    provider: AwsProvider,
) -> None:
    from ipaddress import ip_network

    provider.launch(request(count=1))
    group = _orch_group(provider)
    [ssh] = [rule for rule in _ingress(group) if rule[0] == "tcp" and len(rule) == 4]
    assert ssh[:3] == ("tcp", 22, 22)
    assert ip_network(ssh[3]).prefixlen == 32 and ssh[3] != "0.0.0.0/0"
