"""The reference parts of the docs match the code: the generated spec table and CLI reference,
every setting and ORCH_* variable in docs/config.md, every EC2 action the AWS provider
calls in the IAM policy of docs/providers.md, and the tag conditions of that policy and of
the Terraform policy in infra/README.md."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from decimal import Decimal
from ipaddress import IPv4Network
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from orchestrator import config
from orchestrator.cli.reference import (
    UndocumentedError,
    render_sections,
    spec_field_rows,
    stale_sections,
)
from orchestrator.spec.model import JobSpec
from tests.support.doc_blocks import REPO, blocks

# --- generated sections ------------------------------------------------------------------


def test_generated_sections_are_current() -> None:
    stale = stale_sections()
    assert not stale, f"docs out of date for {stale}: run `make docs` and commit the result"


def test_every_spec_field_is_in_the_table() -> None:
    documented = {row[0] for row in spec_field_rows()}

    def dotted(model: type[BaseModel], prefix: str = "") -> set[str]:
        names = set()
        for name, field in model.model_fields.items():
            names.add(prefix + name)
            for nested in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(nested, type) and issubclass(nested, BaseModel):
                    is_list = getattr(field.annotation, "__origin__", None) is list
                    sub = f"{prefix}{name}[]." if is_list else f"{prefix}{name}."
                    names |= dotted(nested, sub)
        return names

    assert dotted(JobSpec) == documented
    page = (REPO / "docs" / "spec.md").read_text()
    for name in documented:
        assert f"| `{name}` |" in page


def test_an_undocumented_field_is_refused() -> None:
    class Spec(BaseModel):
        told: int = Field(default=1, description="a documented field")
        untold: int = 2

    with pytest.raises(UndocumentedError, match="untold"):
        list(spec_field_rows(Spec))


def test_a_stale_section_is_found_and_rewritten() -> None:
    begin = "<!-- generated:x:begin (make docs; edits here are lost) -->"
    text = f"intro\n{begin}\nold\n<!-- generated:x:end -->\nrest\n"
    assert render_sections(text, "x", "new") == text.replace("old", "new")
    assert render_sections(text, "x", "old") == text


# --- settings -------------------------------------------------------------------------------

_ROW = re.compile(r"^\| `(?P<key>[a-z_]+\.[a-z_]+)` \|(?P<var>[^|]*)\|(?P<default>[^|]*)\|", re.M)


def _default_text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return "{}" if not value else json.dumps(value)
    if isinstance(value, Decimal | IPv4Network | Path):
        return str(value)
    return str(value)


def test_every_setting_and_variable_is_documented_with_its_default() -> None:
    page = (REPO / "docs" / "config.md").read_text()
    rows = {m.group("key"): m for m in _ROW.finditer(page)}
    by_key = {f"{section}.{key}": var for var, (section, key) in config._ENV_OVERRIDES.items()}
    sections = {
        "local": config.LocalSettings,
        "aws": config.AwsSettings,
        "controller": config.ControllerSettings,
        "store": config.StoreSettings,
        "checkpoint": config.CheckpointSettings,
        "logs": config.LogSettings,
        "ledger": config.LedgerSettings,
        "budget": config.BudgetSettings,
    }
    expected = set()
    for section, model in sections.items():
        defaults = model()
        for name in model.model_fields:
            key = f"{section}.{name}"
            expected.add(key)
            assert key in rows, f"docs/config.md has no row for {key}"
            row = rows[key]
            documented = row.group("default").strip().strip("`")
            assert documented == _default_text(getattr(defaults, name)), key
            variable = row.group("var").strip().strip("`")
            assert variable == by_key.get(key, ""), f"{key}: variable {variable!r}"
    assert set(rows) == expected, f"rows for settings that do not exist: {set(rows) - expected}"


# --- IAM: every EC2 action the provider calls is in the documented policy ---------------------

IMPLIED = {"ec2:CreateTags"}  # tags given to RunInstances/CreateSecurityGroup need it too


def _ec2_operations() -> tuple[dict[str, str], dict[str, str]]:
    """(snake_case operation -> EC2 action name, waiter name -> action name) of botocore."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    model = session.get_service_model("ec2")
    operations = {xform_name(name): name for name in model.operation_names}
    waiters_model = session.get_waiter_model("ec2")
    waiters = {
        xform_name(name): waiters_model.get_waiter(name).operation
        for name in waiters_model.waiter_names
    }
    return operations, waiters


def ec2_actions_in(source: str) -> set[str]:
    """EC2 actions a module's code calls: `client.run_instances(...)` (or the method handed on
    uncalled, `call(client.revoke_security_group_ingress, ...)`), paginators and waiters named
    by string (`get_paginator("describe_instances")`, `get_waiter("instance_running")`)."""
    operations, waiters = _ec2_operations()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in operations:
            found.add(operations[node.attr])
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in operations:
                found.add(operations[node.value])
            if node.value in waiters:
                found.add(waiters[node.value])
    return {f"ec2:{name}" for name in found}


def _aws_modules() -> list[Path]:
    """The orchestrator modules that talk to EC2 (boto3, or a client handed in) outside the
    sandbox, which is a local stand-in for AWS rather than a caller of it."""
    root = REPO / "orchestrator"
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if "sandbox" not in path.relative_to(root).parts
        and re.search(r"boto3|botocore|get_paginator|get_waiter", path.read_text())
    ]


def _policy_on(page: Path) -> dict:
    [policy] = [b for b in blocks(page) if b.kind == "iam-policy"]
    return json.loads(policy.text)


def _documented_policy() -> dict:
    """The policy orch's AWS provider runs with."""
    return _policy_on(REPO / "docs" / "providers.md")


def _infra_policy() -> dict:
    """The policy of the identity that runs Terraform on infra/."""
    return _policy_on(REPO / "infra" / "README.md")


def _actions(policy: dict) -> set[str]:
    actions: set[str] = set()
    for statement in policy["Statement"]:
        listed = statement["Action"]
        actions |= {listed} if isinstance(listed, str) else set(listed)
    return actions


def test_the_scan_finds_calls_paginators_and_waiters() -> None:
    source = (
        "ec2.describe_volumes(Filters=[])\n"
        "ec2.get_paginator('describe_snapshots').paginate()\n"
        "ec2.get_waiter('instance_terminated').wait()\n"
        "retry(ec2.delete_security_group, GroupId=g)\n"
        "unrelated.run(x)\n"
    )
    assert ec2_actions_in(source) == {
        "ec2:DescribeVolumes",
        "ec2:DescribeSnapshots",
        "ec2:DescribeInstances",
        "ec2:DeleteSecurityGroup",
    }


def test_every_ec2_action_the_provider_calls_is_in_the_documented_policy() -> None:
    modules = _aws_modules()
    names = {str(p.relative_to(REPO / "orchestrator")) for p in modules}
    assert names >= {"providers/aws/provider.py", "providers/aws/network.py", "providers/offers.py"}
    called = set().union(*(ec2_actions_in(p.read_text()) for p in modules))
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:DescribeInstances"} <= called
    documented = {a for a in _actions(_documented_policy()) if a.startswith("ec2:")}
    missing = called - documented
    assert not missing, f"docs/providers.md's IAM policy lacks {sorted(missing)}"
    extra = documented - called - IMPLIED
    assert not extra, f"the IAM policy lists actions orch never calls: {sorted(extra)}"
    table = (REPO / "docs" / "providers.md").read_text()
    for action in called | IMPLIED:
        assert f"`{action}`" in table, f"the permissions table does not explain {action}"


def test_the_spot_service_linked_role_is_limited_to_spot() -> None:
    [statement] = [
        s for s in _documented_policy()["Statement"] if "iam:CreateServiceLinkedRole" in s["Action"]
    ]
    assert statement["Condition"] == {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}}


def _statements_allowing(action: str, policy: dict | None = None) -> list[dict]:
    """The statements of `policy` (docs/providers.md's by default) that allow `action`,
    by name or by a wildcard."""
    found = []
    for statement in (policy or _documented_policy())["Statement"]:
        listed = statement["Action"]
        names = {listed} if isinstance(listed, str) else set(listed)
        if any(fnmatch.fnmatchcase(action, name) for name in names):
            assert statement["Effect"] == "Allow"
            found.append(statement)
    return found


def _resources(statement: dict) -> set[str]:
    listed = statement["Resource"]
    return {listed} if isinstance(listed, str) else set(listed)


# What an instance orch launches carries: a job's node its orch-job tag, the controller host
# its role (`host_node.host_tags`); the documented policy creates and ends nothing else.
ORCH_INSTANCES = {
    "Null": {"aws:{}Tag/orch-job": "false"},
    "StringEquals": {"aws:{}Tag/orch-role": "controller-host"},
}


def _orch_instance_conditions(kind: str) -> list[dict]:
    return [{op: {k.format(kind): v for k, v in block.items()}}
            for op, block in ORCH_INSTANCES.items()]  # fmt: skip


def test_the_documented_policy_ends_only_orch_s_instances() -> None:
    for action in ("ec2:TerminateInstances", "ec2:StopInstances", "ec2:RebootInstances"):
        for statement in _statements_allowing(action):
            assert _resources(statement) == {"arn:aws:ec2:*:*:instance/*"}
            assert statement["Condition"] in _orch_instance_conditions("Resource")
    ended = [s["Condition"] for s in _statements_allowing("ec2:TerminateInstances")]
    assert sorted(map(str, ended)) == sorted(map(str, _orch_instance_conditions("Resource")))
    for action in ("ec2:StopInstances", "ec2:StartInstances", "ec2:ModifyInstanceAttribute"):
        assert not _statements_allowing(action), f"orch never calls {action}"
    from orchestrator.host.layout import ROLE
    from orchestrator.providers.aws.host_node import TAG_ROLE

    assert (TAG_ROLE, ROLE) == ("orch-role", "controller-host")


def test_the_documented_policy_tags_only_at_launch() -> None:
    [statement] = _statements_allowing("ec2:CreateTags")
    assert "*" not in _resources(statement)
    allowed = statement["Condition"]["StringEquals"]["ec2:CreateAction"]
    assert set(allowed) <= {"RunInstances", "CreateSecurityGroup"} and "RunInstances" in allowed
    assert list(statement["Condition"]) == ["StringEquals"]


def test_the_documented_policy_launches_only_tagged_instances() -> None:
    statements = _statements_allowing("ec2:RunInstances")
    created = {"arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"}
    for statement in statements:
        resources = _resources(statement)
        assert "*" not in resources
        if resources & created:  # what the call creates: a job's node, or the controller host
            assert statement["Condition"] in _orch_instance_conditions("Request")
        else:  # what it only uses (image, subnet, group, key) carries no condition to meet
            assert "Condition" not in statement
    covered = set().union(*(_resources(s) for s in statements))
    assert created <= covered and "arn:aws:ec2:*::image/*" in covered
    # and the launch does tag both with orch-job
    from orchestrator.providers.aws.ec2_requests import TAG_JOB, run_instances_args
    from tests.unit.providers.test_aws_offers import rank

    args = run_instances_args(
        rank(spot=False, accelerator="A10G")[0],
        image_id="ami-1",
        subnet_id="subnet-1",
        security_group_ids=["sg-1"],
        key_name=None,
        tags={TAG_JOB: "j"},
        token="t",
        user_data_text="",
        max_price=None,
        root_device_name="/dev/sda1",
    )
    tagged = {s["ResourceType"] for s in args["TagSpecifications"] if
              {"Key": TAG_JOB, "Value": "j"} in s["Tags"]}  # fmt: skip
    assert tagged == {"instance", "volume"}


# --- the Terraform identity's policy (infra/README.md) ------------------------------------

# The EC2 resources infra/*.tf tags: the call that creates each (and tags it, TagSpecifications)
# and its ARN's resource type.
INFRA_CREATES = {
    "aws_vpc": ("CreateVpc", "vpc"),
    "aws_subnet": ("CreateSubnet", "subnet"),
    "aws_internet_gateway": ("CreateInternetGateway", "internet-gateway"),
    "aws_route_table": ("CreateRouteTable", "route-table"),
    "aws_security_group": ("CreateSecurityGroup", "security-group"),
    "aws_vpc_security_group_ingress_rule": ("AuthorizeSecurityGroupIngress", "security-group-rule"),
    "aws_vpc_security_group_egress_rule": ("AuthorizeSecurityGroupEgress", "security-group-rule"),
    "aws_key_pair": ("ImportKeyPair", "key-pair"),
}
RETAG_CONDITION = {
    "Null": {"aws:ResourceTag/orch-owner": "false"},
    "ForAllValues:StringNotEquals": {"aws:TagKeys": ["orch-owner"]},
}


def _tagged_ec2_resources() -> set[str]:
    """The resource types of infra/*.tf whose blocks set `tags` (IAM ones left out)."""
    found = set()
    for path in sorted((REPO / "infra").glob("*.tf")):
        for block in re.split(r"^(?=resource )", path.read_text(), flags=re.MULTILINE):
            kind = re.match(r'resource "(aws_[a-z0-9_]+)"', block)
            tags = re.search(r"^\s*tags\s*=", block, flags=re.MULTILINE)
            if kind and tags and not kind.group(1).startswith("aws_iam_"):
                found.add(kind.group(1))
    return found


def _tag_at_create(policy: dict) -> list[dict]:
    return [
        s for s in _statements_allowing("ec2:CreateTags", policy)
        if "ec2:CreateAction" in s.get("Condition", {}).get("StringEquals", {})
    ]  # fmt: skip


@pytest.mark.parametrize("page", ["docs/providers.md", "infra/README.md"])
def test_no_policy_tags_launches_or_ends_without_a_condition(page: str) -> None:
    """Neither documented policy allows tagging, launching or ending on "*", by name or by a
    wildcard action, without a condition to meet."""
    policy = _policy_on(REPO / page)
    actions = (
        "ec2:CreateTags", "ec2:DeleteTags", "ec2:RunInstances", "ec2:TerminateInstances",
        "ec2:StopInstances", "ec2:RebootInstances",
    )  # fmt: skip
    for action in actions:
        for statement in _statements_allowing(action, policy):
            if action == "ec2:RunInstances" and "Condition" not in statement:
                continue  # what a launch only uses: checked by the test on launches
            assert "*" not in _resources(statement), f"{page}: {action} on *"
            assert statement.get("Condition"), f"{page}: {action} without a condition"


def test_the_infra_policy_tags_only_at_creation_or_what_already_is_orchs() -> None:
    """Terraform's identity tags a resource only in the call that creates it, with the
    orch-owner tag in the request; later it may retag only what carries orch-owner, and
    never that tag itself."""
    policy = _infra_policy()
    at_create = _tag_at_create(policy)
    assert len(at_create) == 1, "one statement allows CreateTags inside the create calls"
    [statement] = at_create
    assert statement["Condition"]["Null"] == {"aws:RequestTag/orch-owner": "false"}
    assert set(statement["Condition"]) == {"StringEquals", "Null"}
    creates = set(statement["Condition"]["StringEquals"]["ec2:CreateAction"])
    allowed = {a for a in _actions(policy) if a.startswith("ec2:")}
    assert {f"ec2:{name}" for name in creates} <= allowed
    for action in ("ec2:CreateTags", "ec2:DeleteTags"):
        for other in _statements_allowing(action, policy):
            if other is not statement:
                assert other["Condition"] == RETAG_CONDITION, other.get("Sid")
    assert _statements_allowing("ec2:DeleteTags", policy)


def test_every_resource_infra_tags_is_tagged_under_the_policy() -> None:
    """Each EC2 resource infra/*.tf tags is tagged by a create call the policy lets tag, on a
    resource type it names; a resource added to infra/ without its line here fails."""
    tagged = _tagged_ec2_resources()
    assert {"aws_vpc", "aws_subnet", "aws_security_group", "aws_key_pair"} <= tagged
    unknown = tagged - set(INFRA_CREATES)
    assert not unknown, f"add the create call of {sorted(unknown)} to INFRA_CREATES and the policy"
    [statement] = _tag_at_create(_infra_policy())
    creates = set(statement["Condition"]["StringEquals"]["ec2:CreateAction"])
    resources = _resources(statement)
    for kind in sorted(tagged):
        action, arn_type = INFRA_CREATES[kind]
        assert action in creates, f"{kind}: {action} may not tag what it creates"
        assert f"arn:aws:ec2:*:*:{arn_type}/*" in resources, f"{kind}: {arn_type} not taggable"


def test_the_infra_identity_never_launches_or_ends_instances() -> None:
    """Launching and ending nodes is orch's provider's, under the policy infra/README.md
    points to."""
    policy = _infra_policy()
    for action in ("ec2:RunInstances", "ec2:TerminateInstances", "ec2:StopInstances"):
        assert not _statements_allowing(action, policy), action
    readme = (REPO / "infra" / "README.md").read_text()
    assert "(../docs/providers.md#iam-permissions-orch-needs)" in readme
    assert "### IAM permissions orch needs" in (REPO / "docs" / "providers.md").read_text()
