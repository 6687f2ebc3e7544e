"""Where the spec puts AWS nodes, against a moto EC2 server: instance types in order of
preference, zones, regions (only those orch lists and ends nodes in), the image by id or by
name, and ports opened to this machine's address alone. Each is also in the dry-run plan."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.errors import CapacityError, ConfigError, ProviderError
from orchestrator.providers.aws.cluster_network import cluster_group_name
from orchestrator.providers.aws.network import ports_group_name
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.spec.model import Budget
from tests.support.aws_moto import (  # noqa: F401  (the fixture)
    REGION,
    make_provider,
    moto_provider,
    request,
    running,
)

pytestmark = pytest.mark.timeout(60)


def images(provider: AwsProvider) -> list[dict]:
    found = provider.client(REGION).describe_images(
        Filters=[{"Name": "name", "Values": ["ubuntu/images/*"]}]
    )["Images"]
    return sorted(found, key=lambda i: i["Name"])


def test_listed_instance_types_are_taken_in_their_order_not_by_price(
    provider: AwsProvider,
) -> None:
    wanted = request(spot=False, instance_types=("g5.2xlarge", "g5.xlarge"))
    plan = provider.plan(wanted, Budget())
    assert plan.plan.instance_type == "g5.2xlarge"  # preferred, though g5.xlarge is cheaper
    assert plan.plan.price_per_node_hour == Decimal("1.212")
    assert {o["instance_type"] for o in plan.document["offers"]} == {"g5.2xlarge", "g5.xlarge"}
    assert plan.document["placement"] == {"instance_types": ["g5.2xlarge", "g5.xlarge"]}
    nodes = provider.launch(wanted)
    assert {d["InstanceType"] for d in running(provider)} == {"g5.2xlarge"}
    provider.terminate([n.instance_id for n in nodes])


def test_a_listed_type_that_does_not_fit_leaves_no_offer(provider: AwsProvider) -> None:
    with pytest.raises(CapacityError) as refused:
        provider.plan(request(instance_types=("p4d.24xlarge",)), Budget())  # not an A10G
    assert "instance types" in refused.value.message


def test_nodes_go_only_to_the_zones_listed(provider: AwsProvider) -> None:
    wanted = request(spot=False, zones=(f"{REGION}b",))
    assert provider.plan(wanted, Budget()).plan.zone == f"{REGION}b"
    nodes = provider.launch(wanted)
    zones = {d["Placement"]["AvailabilityZone"] for d in running(provider)}
    assert zones == {f"{REGION}b"}
    provider.terminate([n.instance_id for n in nodes])


@pytest.mark.parametrize("field", ["regions", "zones"])
def test_a_region_orch_does_not_list_is_refused_before_any_launch(
    provider: AwsProvider, field: str
) -> None:
    value = ("eu-west-1",) if field == "regions" else ("eu-west-1a",)
    with pytest.raises(ConfigError) as refused:
        provider.launch(request(**{field: value}))
    assert refused.value.exit_code == 2
    assert "eu-west-1" in refused.value.message and "aws.regions" in (refused.value.hint or "")
    assert running(provider) == []


def test_the_image_is_taken_by_id_or_by_its_name(provider: AwsProvider) -> None:
    first, last = images(provider)[0], images(provider)[-1]
    by_id = provider.launch(request(count=1, spot=False, image=first["ImageId"]))
    by_name = provider.launch(request(job="job2", count=1, spot=False, image=last["Name"]))
    launched = {d["InstanceId"]: d["ImageId"] for d in running(provider)}
    assert launched[by_id[0].instance_id] == first["ImageId"]
    assert launched[by_name[0].instance_id] == last["ImageId"]
    provider.terminate([by_id[0].instance_id, by_name[0].instance_id])
    with pytest.raises(ProviderError):
        provider.launch(request(job="job3", count=1, spot=False, image="ami-0123456789abcdef0"))
    assert running(provider) == []


def test_ports_are_opened_to_this_machine_alone_in_a_group_of_their_own(
    provider: AwsProvider,
) -> None:
    nodes = provider.launch(request(spot=False, ports=("6006", "8000-8010")))
    ec2 = provider.client(REGION)
    groups = {
        g["GroupName"]: g
        for d in running(provider)
        for g in ec2.describe_security_groups(GroupIds=[s["GroupId"] for s in d["SecurityGroups"]])[
            "SecurityGroups"
        ]
    }
    ssh = [p for p in groups["orch"]["IpPermissions"] if p.get("FromPort") == 22]
    # the address SSH is open to: this machine's
    [cidr] = [r["CidrIp"] for p in ssh for r in p["IpRanges"]]
    name = ports_group_name(cidr, ("6006", "8000-8010"))
    assert set(groups) == {"orch", name, cluster_group_name(None, "job1")}
    opened = sorted(
        (p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
        for p in groups[name]["IpPermissions"]
    )
    assert opened == [("tcp", 6006, 6006, [cidr]), ("tcp", 8000, 8010, [cidr])]
    again = provider.launch(request(job="job2", count=1, spot=False, ports=("8000-8010", "6006")))
    described = running(provider, **{"instance-id": again[0].instance_id})[0]
    assert groups[name]["GroupId"] in {s["GroupId"] for s in described["SecurityGroups"]}
    provider.terminate([n.instance_id for n in nodes + again])
