"""The offline IAM evaluator the policy tests rely on, and the controller host's role of infra/
as its templates render it: nothing orch never calls (no stop, start or modify of an instance),
every write narrowed to orch's own resources, the store's S3 actions exactly those its client
calls. The role against the recorded calls: tests/integration/test_aws_iam_calls.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.iam_eval import Request, allows
from tests.support.policy_templates import POLICIES, controller_policy, render

REPO = Path(__file__).resolve().parents[4]
VPC = "arn:aws:ec2:us-east-1:123456789012:vpc/vpc-1"
STORE = {
    "node_role_arn": "arn:aws:iam::123456789012:role/orch-node",
    "node_job_policy_arn": "arn:aws:iam::123456789012:policy/orch-node-job",
    "store_objects": "arn:aws:s3:::bucket/team/*",
    "store_bucket_arn": "arn:aws:s3:::bucket",
    "store_list_prefix": "team/*",
}


def _policy(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def test_actions_resources_and_variables_match_as_iam_matches_them() -> None:
    policy = _policy({
        "Effect": "Allow", "Action": "ec2:Describe*",
        "Resource": "*",
    }, {
        "Effect": "Allow", "Action": ["s3:GetObject"],
        "Resource": "arn:aws:s3:::b/p/${aws:PrincipalTag/orch-job}/*",
    })  # fmt: skip
    assert allows(policy, Request("EC2:describeInstances", "*"))
    assert not allows(policy, Request("ec2:RunInstances", "*"))
    tagged = {"aws:PrincipalTag/orch-job": "job1"}
    assert allows(policy, Request("s3:GetObject", "arn:aws:s3:::b/p/job1/x", tagged))
    assert not allows(policy, Request("s3:GetObject", "arn:aws:s3:::b/p/job2/x", tagged))
    assert not allows(policy, Request("s3:GetObject", "arn:aws:s3:::b/p/job1/x"))  # no tag


def test_conditions_and_their_qualifiers() -> None:
    policy = _policy({
        "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*",
        "Condition": {
            "Null": {"aws:ResourceTag/orch-owner": "false"},
            "ForAllValues:StringNotEquals": {"aws:TagKeys": ["orch-owner"]},
            "StringEqualsIfExists": {"aws:RequestTag/team": "ml"},
        },
    })  # fmt: skip
    owned = {"aws:ResourceTag/orch-owner": "x"}
    assert allows(policy, Request("ec2:CreateTags", "*", {**owned, "aws:TagKeys": ("Name",)}))
    assert allows(policy, Request("ec2:CreateTags", "*", owned))  # no keys: ForAllValues holds
    assert not allows(policy, Request("ec2:CreateTags", "*", {"aws:TagKeys": ("Name",)}))
    retag = {**owned, "aws:TagKeys": ("Name", "orch-owner")}
    assert not allows(policy, Request("ec2:CreateTags", "*", retag))
    assert not allows(policy, Request("ec2:CreateTags", "*", {**owned, "aws:RequestTag/team": "x"}))
    age = {"NumericLessThan": {"aws:MultiFactorAuthAge": "3600"}}
    unknown = _policy({"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": age})
    with pytest.raises(ValueError, match="not known"):
        allows(unknown, Request("ec2:RunInstances", "*", {"aws:MultiFactorAuthAge": "1"}))


def _actions(policy: dict) -> set[str]:
    listed = (s["Action"] for s in policy["Statement"])
    return {a for item in listed for a in ([item] if isinstance(item, str) else item)}


def test_the_controller_role_never_stops_starts_or_modifies_an_instance() -> None:
    policy = controller_policy(owner="team", vpc_arn=VPC, store=STORE)
    forbidden = {"ec2:StopInstances", "ec2:StartInstances", "ec2:ModifyInstanceAttribute",
                 "ec2:ModifyInstanceMetadataOptions", "ec2:RebootInstances"}  # fmt: skip
    assert not forbidden & _actions(policy)
    assert not any("*" in a for a in _actions(policy)), "no wildcard actions"
    instance = "arn:aws:ec2:us-east-1:123456789012:instance/i-1"
    for action in forbidden:
        assert not allows(policy, Request(action, instance, {"aws:ResourceTag/orch-owner": "team"}))
    assert allows(policy, Request("ec2:TerminateInstances", instance,
                                  {"aws:ResourceTag/orch-owner": "team"}))  # fmt: skip


def test_every_write_of_the_controller_role_is_narrowed_to_orch_s_resources() -> None:
    """A statement without a condition reads, or names the exact resources it acts on (the
    VPC, the store), or only orch's own IAM path (the jobs' instance profiles), or is what a
    launch only uses."""
    policy = controller_policy(owner="team", vpc_arn=VPC, store=STORE)
    for statement in policy["Statement"]:
        if "Condition" in statement or statement["Sid"] in ("OrchLaunchUses", "OrchIdentity"):
            continue
        actions = _actions({"Statement": [statement]})
        reads = all(a.split(":")[1].startswith(("Describe", "Get", "List")) for a in actions)
        exact = statement["Resource"] in (VPC, STORE["store_objects"])
        ours = statement["Resource"] == "arn:aws:iam::*:instance-profile/orch-node/*"
        assert reads or exact or ours, statement["Sid"]


def _s3_calls_of_the_store_client() -> set[str]:
    """The S3 operations orch's store client makes (cluster/checkpoints/store.py)."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model("s3")
    names = {xform_name(name): name for name in model.operation_names}
    tree = ast.parse((REPO / "orchestrator" / "cluster" / "checkpoints" / "store.py").read_text())
    found = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in names}
    found |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}
    return {names[f] for f in found}


# The IAM action that authorizes each S3 operation the store client makes.
S3_ACTION = {"ListObjectsV2": "s3:ListBucket", "DeleteObjects": "s3:DeleteObject"}


def test_the_controller_role_s_store_actions_are_those_the_store_client_calls() -> None:
    calls = _s3_calls_of_the_store_client()
    assert calls and calls <= set(S3_ACTION), f"map {calls - set(S3_ACTION)} in S3_ACTION"
    store = render("controller-store", **STORE, owner="team")
    granted = {a for a in _actions(store) if a.startswith("s3:")}
    assert granted == {S3_ACTION[c] for c in calls}


def test_the_templates_use_only_what_the_offline_renderer_understands() -> None:
    for path in sorted(POLICIES.glob("*.json.tftpl")):
        text = path.read_text()
        assert "%{" not in text, path.name
        job = {"job_objects": "arn:aws:s3:::b/p/${aws:PrincipalTag/orch-job}/*",
               "job_list_prefix": "p/${aws:PrincipalTag/orch-job}/*"}  # fmt: skip
        data = {"data_objects": ["arn:aws:s3:::d/p/*"], "output_objects": ["arn:aws:s3:::o/p/*"],
                "sid": "ListDataSources0", "bucket_arn": "arn:aws:s3:::d",
                "list_prefixes": ["p/*"], "owner": "o", "vpc_arn": VPC}  # fmt: skip
        render(path.name.removesuffix(".json.tftpl"), **STORE, **job, **data)
