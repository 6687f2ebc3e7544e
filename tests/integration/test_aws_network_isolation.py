"""Who reaches whom on AWS, against a moto EC2 server on 127.0.0.1: each owner's SSH rule in the
default VPC's `orch` group survives the others' launches, the nodes of two jobs do not admit each
other (nor the controller host) beyond SSH, and a cluster's own group ends with the cluster.

moto does not filter traffic: the tests judge the rules moto holds, as EC2 would apply them
(`admits`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest

from orchestrator.providers.aws.cluster_network import (
    CLUSTER_GROUP_PREFIX,
    TAG_CREATED,
    cluster_group_name,
)
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.aws.ssh_rules import rule_description
from tests.support.aws_moto import REGION, make_provider, request, running

pytestmark = pytest.mark.timeout(60)

TORCH_PORTS = (29500, 29400, 12345)  # torchrun's store, c10d rendezvous, an NCCL/gloo port


def _groups(ec2: Any, ids: list[str]) -> dict[str, dict]:
    return {g["GroupId"]: g for g in ec2.describe_security_groups(GroupIds=ids)["SecurityGroups"]}


def _description(provider: AwsProvider, instance_id: str) -> dict:
    [desc] = [d for d in running(provider) if d["InstanceId"] == instance_id]
    return desc


def admits(ec2: Any, target: dict, source: dict, port: int) -> bool:
    """Whether EC2 lets `source` (an instance description) reach `target` on TCP `port`, by
    the ingress rules of the target's groups: a rule matches by port range (or all traffic)
    and by source (a group the source is in, or a CIDR holding its private address)."""
    source_groups = {g["GroupId"] for g in source["SecurityGroups"]}
    source_ip = ip_address(source["PrivateIpAddress"])
    groups = _groups(ec2, [g["GroupId"] for g in target["SecurityGroups"]])
    for group in groups.values():
        for p in group["IpPermissions"]:
            if p["IpProtocol"] not in ("-1", "tcp"):
                continue
            if p["IpProtocol"] == "tcp" and not p["FromPort"] <= port <= p["ToPort"]:
                continue
            if any(pair["GroupId"] in source_groups for pair in p.get("UserIdGroupPairs", [])):
                return True
            if any(source_ip in ip_network(r["CidrIp"]) for r in p.get("IpRanges", [])):
                return True
    return False


def _orch_ssh(provider: AwsProvider) -> dict[str, str]:
    """CIDR -> description of the `orch` group's SSH rules from addresses."""
    [group] = provider.client(REGION).describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["orch"]}]
    )["SecurityGroups"]
    return {
        r["CidrIp"]: r.get("Description", "")
        for p in group["IpPermissions"]
        if p["IpProtocol"] == "tcp" and p.get("FromPort") == 22
        for r in p.get("IpRanges", [])
    }


def test_two_owners_with_different_addresses_both_keep_their_ssh(
    tmp_path: Path, moto_endpoint: str
) -> None:
    alice = make_provider(tmp_path / "a", moto_endpoint, owner="alice", ssh_cidr="198.51.100.7/32")
    bob = make_provider(tmp_path / "b", moto_endpoint, owner="bob", ssh_cidr="203.0.113.9/32")
    alice.launch(request(job="a1", count=1))
    bob.launch(request(job="b1", count=1))
    rules = _orch_ssh(bob)
    assert set(rules) == {"198.51.100.7/32", "203.0.113.9/32"}
    assert "owner=alice" in rules["198.51.100.7/32"] and "owner=bob" in rules["203.0.113.9/32"]
    # alice launches again, from home now: her office rule stays until it is stale, bob's stays
    moved = make_provider(tmp_path / "a", moto_endpoint, owner="alice", ssh_cidr="192.0.2.44/32")
    moved.launch(request(job="a2", count=1))
    assert set(_orch_ssh(bob)) == {"198.51.100.7/32", "203.0.113.9/32", "192.0.2.44/32"}
    bob.launch(request(job="b2", count=1))
    assert set(_orch_ssh(bob)) == {"198.51.100.7/32", "203.0.113.9/32", "192.0.2.44/32"}


def test_only_the_owner_s_own_stale_rules_expire(tmp_path: Path, moto_endpoint: str) -> None:
    alice = make_provider(tmp_path, moto_endpoint, owner="alice", ssh_cidr="198.51.100.7/32")
    ec2 = alice.client(REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    group = ec2.create_security_group(GroupName="orch", Description="o", VpcId=vpc["VpcId"])
    long_ago = datetime.now(UTC) - timedelta(days=30)
    ec2.authorize_security_group_ingress(
        GroupId=group["GroupId"],
        IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [
            {"CidrIp": "192.0.2.1/32", "Description": rule_description("alice", long_ago)},
            {"CidrIp": "192.0.2.2/32", "Description": rule_description("bob", long_ago)},
            {"CidrIp": "192.0.2.3/32", "Description": rule_description("alice", datetime.now(UTC))},
        ]}],
    )  # fmt: skip
    alice.launch(request(count=1))
    rules = _orch_ssh(alice)
    # alice's month-old rule is gone; bob's month-old one and her fresh one stay
    assert set(rules) == {"192.0.2.2/32", "192.0.2.3/32", "198.51.100.7/32"}


def test_two_jobs_do_not_reach_each_other_beyond_ssh(tmp_path: Path, moto_endpoint: str) -> None:
    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    ec2 = provider.client(REGION)
    job1 = provider.launch(request(job="job1", count=2))
    job2 = provider.launch(request(job="job2", count=2))
    one = [_description(provider, n.instance_id) for n in job1]
    two = [_description(provider, n.instance_id) for n in job2]
    for port in TORCH_PORTS:
        assert admits(ec2, one[0], one[1], port) and admits(ec2, one[1], one[0], port)
        assert admits(ec2, two[0], two[1], port)
        for a, b in ((one[0], two[0]), (two[1], one[0]), (one[1], two[1])):
            assert not admits(ec2, a, b, port), f"{b['InstanceId']} reaches {a['InstanceId']}"
    assert admits(ec2, two[0], one[0], 22)  # SSH between members (the controller host's way)
    # each cluster's own group admits its members only
    own = {g["GroupName"] for g in one[0]["SecurityGroups"]} - {"orch"}
    assert own == {cluster_group_name(None, "job1")}
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": list(own)}])[
        "SecurityGroups"
    ]
    assert [(p["IpProtocol"], [g["GroupId"] for g in p["UserIdGroupPairs"]], p["IpRanges"])
            for p in group["IpPermissions"]] == [("-1", [group["GroupId"]], [])]  # fmt: skip
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags["orch-owner"] == "tester" and tags["orch-cluster"] == "job1"


def test_a_controller_host_in_the_network_s_group_reaches_nodes_by_ssh_only(
    tmp_path: Path, moto_endpoint: str
) -> None:
    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    ec2 = provider.client(REGION)
    (node,) = provider.launch(request(count=1))
    target = _description(provider, node.instance_id)
    [orch] = [g["GroupId"] for g in target["SecurityGroups"] if g["GroupName"] == "orch"]
    # the host joins the network's group only, as `host_node.launch_host` launches it
    host_id = ec2.run_instances(
        ImageId=target["ImageId"], MinCount=1, MaxCount=1, SubnetId=target["SubnetId"],
        SecurityGroupIds=[orch],
    )["Instances"][0]["InstanceId"]  # fmt: skip
    [host] = ec2.describe_instances(InstanceIds=[host_id])["Reservations"][0]["Instances"]
    assert admits(ec2, target, host, 22)
    assert not any(admits(ec2, target, host, port) for port in TORCH_PORTS)
    assert not any(admits(ec2, host, target, port) for port in TORCH_PORTS)


def _cluster_groups(provider: AwsProvider) -> set[str]:
    groups = provider.client(REGION).describe_security_groups()["SecurityGroups"]
    return {g["GroupName"] for g in groups if g["GroupName"].startswith(CLUSTER_GROUP_PREFIX)}


def test_a_cluster_s_group_ends_with_its_last_node(tmp_path: Path, moto_endpoint: str) -> None:
    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    job1 = provider.launch(request(job="job1", count=2))
    job2 = provider.launch(request(job="job2", count=1))
    names = {cluster_group_name(None, "job1"), cluster_group_name(None, "job2")}
    assert _cluster_groups(provider) == names
    provider.terminate([job1[1].instance_id])  # a lost node: its survivor keeps the group
    assert _cluster_groups(provider) == names
    provider.terminate([job1[0].instance_id])
    assert _cluster_groups(provider) == {cluster_group_name(None, "job2")}
    provider.terminate([n.instance_id for n in job2])
    assert _cluster_groups(provider) == set()


def test_the_owner_s_leaked_cluster_groups_are_swept_once_old(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """A group left without an instance (a controller killed before it ended it) is deleted by
    the owner's next launch or terminate once `LEAK_GRACE_S` old, never sooner, and never
    another owner's."""
    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    ec2 = provider.client(REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]

    def leaked(name: str, owner: str, made: datetime) -> str:
        return ec2.create_security_group(
            GroupName=CLUSTER_GROUP_PREFIX + name, Description="x", VpcId=vpc["VpcId"],
            TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                {"Key": "orch-owner", "Value": owner},
                {"Key": TAG_CREATED, "Value": made.strftime("%Y-%m-%dT%H:%M:%SZ")},
            ]}],
        )["GroupId"]  # fmt: skip

    old = datetime.now(UTC) - timedelta(hours=3)
    leaked("old", "tester", old)
    leaked("young", "tester", datetime.now(UTC))
    leaked("theirs", "someone-else", old)
    (node,) = provider.launch(request(job="job1", count=1))
    assert _cluster_groups(provider) == {
        CLUSTER_GROUP_PREFIX + "young",
        CLUSTER_GROUP_PREFIX + "theirs",
        cluster_group_name(None, "job1"),
    }
    provider.terminate([node.instance_id])
    assert _cluster_groups(provider) == {
        CLUSTER_GROUP_PREFIX + "young",
        CLUSTER_GROUP_PREFIX + "theirs",
    }


def test_with_terraform_s_network_the_cluster_group_is_made_in_its_vpc(
    tmp_path: Path, moto_endpoint: str
) -> None:
    provider = make_provider(tmp_path, moto_endpoint)
    ec2 = provider.client(REGION)
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.1.0/24", AvailabilityZone="us-east-1b")
    group = ec2.create_security_group(GroupName="tf-orch", Description="tf", VpcId=vpc)
    outputs = {
        "region": {"value": REGION},
        "security_group_id": {"value": group["GroupId"]},
        "subnet_ids": {"value": {"us-east-1b": subnet["Subnet"]["SubnetId"]}},
    }
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    tf = make_provider(tmp_path, moto_endpoint, tf_outputs=tmp_path / "outputs.json")
    (node,) = tf.launch(request(count=1))
    desc = _description(tf, node.instance_id)
    groups = _groups(ec2, [g["GroupId"] for g in desc["SecurityGroups"]])
    assert group["GroupId"] in groups and len(groups) == 2
    assert {g["VpcId"] for g in groups.values()} == {vpc}
    tf.terminate([node.instance_id])
    assert _cluster_groups(tf) == set()


def test_a_launch_moving_to_the_next_zone_keeps_the_cluster_s_group(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """The nodes a refused zone did start are ended, but their cluster's group is the next
    zone's too: it is neither deleted nor waited for in between."""
    from tests.support.aws_moto import provider_query, refuse

    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    first_zone = provider.offers(provider_query())[0].zone
    groups_seen: list[list[str]] = []

    def second_node_in_first_zone(params: dict) -> bool:
        groups_seen.append(params["SecurityGroupIds"])
        zone = params["Placement"]["AvailabilityZone"]
        return zone == first_zone and len(groups_seen) == 2

    provider.launch_client(REGION).meta.events.register(
        "before-parameter-build.ec2.RunInstances",
        refuse("InsufficientInstanceCapacity", second_node_in_first_zone),
    )
    nodes = provider.launch(request(job="job1", count=2))
    assert len(groups_seen) == 4 and all(g == groups_seen[0] for g in groups_seen)
    assert {n.zone for n in nodes} != {first_zone}
    assert _cluster_groups(provider) == {cluster_group_name(None, "job1")}


def test_reconcile_ends_a_leaked_cluster_s_group_with_its_nodes(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """A controller killed with its nodes up: `orch reconcile` ends the nodes, and with them
    their cluster's group."""
    from orchestrator.control.repair.reconcile import reconcile
    from orchestrator.ledger.store import Ledger, make_engine

    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    ledger = Ledger(make_engine(provider.settings.db_path))
    nodes = provider.launch(request(job="ghost", count=2, ledger_id=ledger.ledger_id))
    assert _cluster_groups(provider) == {cluster_group_name(ledger.ledger_id, "ghost")}
    report = reconcile(provider.settings, ledger, [provider])
    assert report.terminated == {"ghost": sorted(n.instance_id for n in nodes)}
    assert _cluster_groups(provider) == set()


def test_an_all_traffic_rule_of_the_orch_group_goes_at_a_launch_while_members_live(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """The `orch` group admits SSH only: a rule admitting all traffic between its members is
    revoked at the next launch even while an instance of the group lives, and the launched
    job's nodes still reach each other on torch's ports, through their cluster's group."""
    provider = make_provider(tmp_path, moto_endpoint, ssh_cidr="198.51.100.7/32")
    ec2 = provider.client(REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    group = ec2.create_security_group(GroupName="orch", Description="o", VpcId=vpc["VpcId"])
    everything = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group["GroupId"]}]}
    ec2.authorize_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[everything])
    image = ec2.describe_images()["Images"][0]["ImageId"]
    member = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1,
                               SecurityGroupIds=[group["GroupId"]])["Instances"][0]  # fmt: skip
    nodes = [_description(provider, n.instance_id) for n in
             provider.launch(request(job="job1", count=2))]  # fmt: skip
    [found] = _groups(ec2, [group["GroupId"]]).values()
    assert not any(p["IpProtocol"] == "-1" for p in found["IpPermissions"])
    for port in TORCH_PORTS:
        assert admits(ec2, nodes[0], nodes[1], port) and admits(ec2, nodes[1], nodes[0], port)
        assert not admits(ec2, nodes[0], member, port)
