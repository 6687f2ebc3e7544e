"""Each documented IAM policy against the exact API calls orch makes, recorded against a moto
server on 127.0.0.1 and evaluated offline (`tests/support/iam_eval.py`): the laptop's policy of
docs/providers.md for a job and for `orch controller up` / `down`, and the controller host's role
of infra/ (rendered from infra/policies/ as Terraform renders it) for the host's own orch.

moto enforces no IAM: what the tests judge is the list of authorizations the calls need."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from orchestrator.providers.aws import node_roles
from orchestrator.providers.aws.provider import AwsProvider
from tests.integration.test_aws_node_roles import job_policy
from tests.support.aws_calls import ACCOUNT, Call, authorizations, operations, recording
from tests.support.aws_moto import PUBLIC_KEY, REGION, make_provider, request
from tests.support.doc_blocks import REPO, blocks
from tests.support.iam_eval import Request, allows, refused
from tests.support.policy_templates import controller_policy

pytestmark = pytest.mark.timeout(90)

OWNER = "orch-team"  # infra/'s var.owner, and the host's aws.owner


def _laptop_policy() -> dict[str, Any]:
    [policy] = [b for b in blocks(REPO / "docs" / "providers.md") if b.kind == "iam-policy"]
    return json.loads(policy.text)


def _profile(endpoint: str, name: str, path: str = "/") -> None:
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION)
    iam.create_role(RoleName=name, Path=path, AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName=name, Path=path)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)


JOB_POLICY_ARN = f"arn:aws:iam::{ACCOUNT}:policy/orch-node-job"


def _a_job_s_life(provider: AwsProvider, *, ports: tuple[str, ...] = ("6006",)) -> None:
    """Two jobs' launches (spot, with `ports`; on-demand with a store, so a role of its own), a
    lost node, the ends; then a job role a controller killed in between left behind, swept an
    hour later."""
    first = provider.launch(request(job="job1", count=2, ports=ports))
    second = provider.launch(request(job="job2", count=1, spot=False, store="s3://my-bucket/orch"))
    provider.identity()
    provider.terminate([first[1].instance_id])
    provider.terminate([first[0].instance_id, *(n.instance_id for n in second)])
    iam = provider.iam_client()
    node_roles.ensure_job_profile(iam, job_id="job3", ledger_id=None, owner=provider.owner,
                                  policy_arn=JOB_POLICY_ARN)  # fmt: skip
    later = datetime.now(UTC) + timedelta(hours=2)
    assert node_roles.sweep(iam, provider.owner, set(), JOB_POLICY_ARN, now=later)


def test_the_laptop_policy_allows_every_call_of_a_job(tmp_path: Path, moto_endpoint: str) -> None:
    policy = job_policy(moto_endpoint)
    with recording(moto_endpoint) as calls:
        provider = make_provider(
            tmp_path, moto_endpoint, owner="alice", ssh_cidr="198.51.100.7/32",
            instance_profile="orch-node", node_job_policy=policy,
        )  # fmt: skip
        _a_job_s_life(provider)
    wanted = {"ec2:RunInstances", "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup",
              "ec2:TerminateInstances", "iam:CreateRole", "iam:DeleteRole"}  # fmt: skip
    assert wanted <= operations(calls)
    assert refused(_laptop_policy(), authorizations(calls)) == []


def _controller_up_and_down(provider: AwsProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `orch controller up --provider aws` and `down` call: the host's launch (its SSH
    answer stood in for: moto's addresses lead nowhere), the VPC lookup of its setup, and its
    end."""
    from orchestrator.host.aws_host import _vpc_cidr
    from orchestrator.host.layout import ROLE
    from orchestrator.providers.aws import host_node, node_launcher

    monkeypatch.setattr(node_launcher, "answers_ssh", lambda host, port: True)
    host = host_node.launch_host(
        provider, role=ROLE, public_key=PUBLIC_KEY, instance_type="t3.small",
        instance_profile="orch-controller",
    )  # fmt: skip
    _vpc_cidr(provider, REGION, host.instance_id)
    provider.terminate([host.instance_id])
    assert host_node.host_gone(provider, host.instance_id)


def test_the_laptop_policy_allows_controller_up_and_down(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _profile(moto_endpoint, "orch-controller")
    with recording(moto_endpoint) as calls:
        provider = make_provider(tmp_path, moto_endpoint, owner="alice",
                                 ssh_cidr="198.51.100.7/32")  # fmt: skip
        _controller_up_and_down(provider, monkeypatch)
    needed = authorizations(calls)
    assert {"ec2:RunInstances", "iam:PassRole", "ec2:TerminateInstances"} <= {
        r.action for r in needed
    }
    assert refused(_laptop_policy(), needed) == []


def _infra_network(provider: AwsProvider, tmp_path: Path) -> tuple[Path, str]:
    """A network as infra/ makes it (its VPC, a subnet, the nodes' group admitting SSH, the key
    pair), as `terraform output -json`; and the VPC's ARN."""
    ec2 = provider.client(REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/20", AvailabilityZone="us-east-1a")
    group = ec2.create_security_group(
        GroupName="orch-nodes", Description="nodes", VpcId=vpc,
        TagSpecifications=[{"ResourceType": "security-group",
                            "Tags": [{"Key": "orch-owner", "Value": OWNER}]}],
    )["GroupId"]  # fmt: skip
    ec2.import_key_pair(KeyName="orch", PublicKeyMaterial=PUBLIC_KEY.encode())
    outputs = {
        "region": REGION, "key_name": "orch", "security_group_id": group,
        "subnet_ids": {"us-east-1a": subnet["Subnet"]["SubnetId"]}, "instance_profile": "orch-node",
        "node_job_policy": JOB_POLICY_ARN,
    }  # fmt: skip
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    return path, f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{vpc}"


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


STORE = {
    "node_role_arn": f"arn:aws:iam::{ACCOUNT}:role/orch-node",
    "node_job_policy_arn": JOB_POLICY_ARN,
    "store_objects": "arn:aws:s3:::my-bucket/orch/*",
    "store_bucket_arn": "arn:aws:s3:::my-bucket",
    "store_list_prefix": "orch/*",
}


def _host_s_orch(tmp_path: Path, endpoint: str) -> tuple[list[Call], dict[str, Any]]:
    """The calls of the host's orch running jobs on infra/'s network, and the role's policy."""
    policy = job_policy(endpoint)
    setup = make_provider(tmp_path, endpoint, owner=OWNER)
    outputs, vpc_arn = _infra_network(setup, tmp_path)
    with recording(endpoint) as calls:
        provider = make_provider(tmp_path, endpoint, owner=OWNER, tf_outputs=outputs)
        _a_job_s_life(provider, ports=())  # the role makes no group but its clusters'

    assert policy == JOB_POLICY_ARN
    return calls, controller_policy(owner=OWNER, vpc_arn=vpc_arn, store=STORE)


def test_the_controller_role_allows_every_call_of_the_host_s_orch(
    tmp_path: Path, moto_endpoint: str
) -> None:
    calls, policy = _host_s_orch(tmp_path, moto_endpoint)
    assert refused(policy, authorizations(calls)) == []


def test_the_controller_role_grants_only_what_the_host_s_orch_calls(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """Every action of the role is needed by a call of the host's orch (the checkpoint store's
    S3 calls, made by the store's client, are checked in test_iam_policies); none is there for
    nothing, and a stolen host credential cannot stop, restart or modify an instance."""
    calls, policy = _host_s_orch(tmp_path, moto_endpoint)
    needed = {r.action for r in authorizations(calls)}
    granted = {a for s in policy["Statement"] for a in _listed(s["Action"])}
    unused = {a for a in granted - needed if not a.startswith(("s3:", "sts:"))}
    assert unused == set(), f"the controller role grants actions orch never calls: {unused}"
    for action in ("ec2:StopInstances", "ec2:StartInstances", "ec2:ModifyInstanceAttribute"):
        assert not allows(policy, Request(action, f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1",
                                          {"aws:ResourceTag/orch-owner": OWNER}))  # fmt: skip


def test_the_controller_role_touches_only_its_owner_s_instances_and_cluster_groups(
    tmp_path: Path, moto_endpoint: str
) -> None:
    _calls, policy = _host_s_orch(tmp_path, moto_endpoint)
    vpc = next(s for s in policy["Statement"] if s["Sid"] == "OrchClusterGroupVpc")["Resource"]
    group = f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/sg-1"
    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1"
    theirs = {"aws:ResourceTag/orch-owner": "someone-else"}
    network = {"aws:ResourceTag/orch-owner": OWNER}  # infra/'s group: no orch-cluster tag
    cluster = {**network, "aws:ResourceTag/orch-cluster": "job1"}
    for denied in (
        Request("ec2:TerminateInstances", instance, theirs),
        Request("ec2:TerminateInstances", instance, {}),
        Request("ec2:AuthorizeSecurityGroupIngress", group, network),
        Request("ec2:DeleteSecurityGroup", group, network),
        Request("ec2:RevokeSecurityGroupIngress", group, cluster),
        Request("ec2:CreateSecurityGroup", f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-other"),
        Request("ec2:CreateTags", instance, {"ec2:CreateAction": "CreateTags"}),
    ):
        assert not allows(policy, denied), denied
    assert allows(policy, Request("ec2:CreateSecurityGroup", vpc))
