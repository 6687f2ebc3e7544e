"""The AWS API calls orch makes, recorded as they are made, and the IAM authorizations each needs.

`recording()` hooks boto3's default session: every client made from it while the block runs
(the provider's EC2 clients, STS, IAM) reports each call with its parameters, and the tags of
the resources it acts on as they are at that moment (read from the same endpoint by a client of
its own, which is not recorded). `authorizations(calls)` turns them into the requests EC2, IAM
and STS authorize (`iam_eval.Request`), the way AWS documents them: RunInstances on the instance
and volume it creates (with their request tags), on the image, subnet, network interface,
groups, key pair and spot request it uses, CreateTags inside it, iam:PassRole for its instance
profile; a call on an existing resource with that resource's tags. A call it does not know
raises: a new call in the code must be described here before a policy can be judged on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.session

from tests.support.iam_eval import Request, Value

ACCOUNT = "123456789012"  # moto's


@dataclass(frozen=True)
class Call:
    """One API call as the code made it."""

    service: str  # "ec2", "iam", "sts"
    operation: str  # "RunInstances"
    params: dict[str, Any]
    region: str
    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # resource id -> its tags
    roles: dict[str, str] = field(default_factory=dict)  # instance profile -> its role's ARN
    role_arn: str = ""  # the role an IAM call names (RoleName), as IAM knows it then


class _Lookup:
    """Reads tags and profiles from the endpoint, with clients that are not recorded."""

    def __init__(self, endpoint: str) -> None:
        session = botocore.session.Session()
        self.ec2 = session.create_client("ec2", region_name="us-east-1", endpoint_url=endpoint)
        self.iam = session.create_client("iam", region_name="us-east-1", endpoint_url=endpoint)

    def tags(self, ids: list[str]) -> dict[str, dict[str, str]]:
        if not ids:
            return {}
        found = self.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": ids}])["Tags"]
        out: dict[str, dict[str, str]] = {i: {} for i in ids}
        for tag in found:
            out.setdefault(tag["ResourceId"], {})[tag["Key"]] = tag["Value"]
        return out

    def role(self, name: str) -> tuple[str, dict[str, str]]:
        """(ARN, tags) of role `name`; ("", {}) when there is none (yet)."""
        try:
            role = self.iam.get_role(RoleName=name)["Role"]
        except self.iam.exceptions.NoSuchEntityException:
            return "", {}
        tags = self.iam.list_role_tags(RoleName=name)["Tags"]
        return role["Arn"], {t["Key"]: t["Value"] for t in tags}

    def role_of(self, profile: dict[str, str]) -> dict[str, str]:
        name = profile.get("Name") or profile["Arn"].rsplit("/", 1)[1]
        roles = self.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
        return {name: roles[0]["Arn"]} if roles else {}


def _acted_on(operation: str, params: dict[str, Any]) -> list[str]:
    if operation == "TerminateInstances":
        return list(params["InstanceIds"])
    if "GroupId" in params:
        return [params["GroupId"]]
    return []


@contextlib.contextmanager
def recording(endpoint: str) -> Iterator[list[Call]]:
    """Record every call of the clients boto3's default session makes meanwhile."""
    calls: list[Call] = []
    lookup = _Lookup(endpoint)
    session = boto3.DEFAULT_SESSION or boto3.setup_default_session() or boto3.DEFAULT_SESSION
    assert session is not None
    events = session._session.get_component("event_emitter")

    def record(params: dict[str, Any], model: Any, context: Any, **_: Any) -> None:
        service = model.service_model.endpoint_prefix
        region = (context or {}).get("client_region") or "us-east-1"  # the client's region
        profile = params.get("IamInstanceProfile")
        tags = lookup.tags(_acted_on(model.name, params)) if service == "ec2" else {}
        role_arn = ""
        if service == "iam" and "RoleName" in params:
            role_arn, tags[params["RoleName"]] = lookup.role(params["RoleName"])
        calls.append(Call(
            service=service, operation=model.name, params=dict(params), region=region,
            tags=tags, roles=lookup.role_of(profile) if profile else {}, role_arn=role_arn,
        ))  # fmt: skip

    events.register("before-parameter-build", record)
    try:
        yield calls
    finally:
        events.unregister("before-parameter-build", record)


def _arn(call: Call, kind: str, name: str = "*", *, account: bool = True) -> str:
    return f"arn:aws:ec2:{call.region}:{ACCOUNT if account else ''}:{kind}/{name}"


def _tag_keys(prefix: str, tags: dict[str, str]) -> dict[str, Value]:
    out: dict[str, Value] = {f"{prefix}/{k}": v for k, v in tags.items()}
    return out


def _requested_tags(params: dict[str, Any], kind: str) -> dict[str, str]:
    for spec in params.get("TagSpecifications") or []:
        if spec["ResourceType"] == kind:
            return {t["Key"]: t["Value"] for t in spec["Tags"]}
    return {}


def _creating(call: Call, kind: str, tags: dict[str, str]) -> list[Request]:
    """The request to create a `kind` with `tags`, and to tag it inside the same call."""
    keys: dict[str, Value] = {**_tag_keys("aws:RequestTag", tags), "aws:TagKeys": tuple(tags)}
    made = Request(f"ec2:{call.operation}", _arn(call, kind), keys, call.operation)
    if not tags:
        return [made]
    tagging = {**keys, "ec2:CreateAction": call.operation}
    return [made, Request("ec2:CreateTags", _arn(call, kind), tagging, call.operation)]


def _existing(call: Call, kind: str, resource_id: str) -> Request:
    tags = call.tags.get(resource_id, {})
    keys = {**_tag_keys("aws:ResourceTag", tags), **_tag_keys("ec2:ResourceTag", tags)}
    return Request(f"ec2:{call.operation}", _arn(call, kind, resource_id), keys, call.operation)


def _run_instances(call: Call) -> list[Request]:
    p = call.params
    out = _creating(call, "instance", _requested_tags(p, "instance"))
    out += _creating(call, "volume", _requested_tags(p, "volume"))
    action = "ec2:RunInstances"
    uses = [
        f"arn:aws:ec2:{call.region}::image/{p['ImageId']}",
        _arn(call, "network-interface"),
        *(_arn(call, "security-group", g) for g in p.get("SecurityGroupIds") or []),
    ]
    if "SubnetId" in p:
        uses.append(_arn(call, "subnet", p["SubnetId"]))
    if "KeyName" in p:
        uses.append(_arn(call, "key-pair", p["KeyName"]))
    if (p.get("InstanceMarketOptions") or {}).get("MarketType") == "spot":
        uses.append(_arn(call, "spot-instances-request"))
    out += [Request(action, arn, {}, call.operation) for arn in uses]
    for role in call.roles.values():
        passed = {"iam:PassedToService": "ec2.amazonaws.com"}
        out.append(Request("iam:PassRole", role, passed, call.operation))
    return out


_READS = ("Describe", "Get", "List")


def _ec2(call: Call) -> list[Request]:
    op, p = call.operation, call.params
    if op.startswith(_READS):
        return [Request(f"ec2:{op}", "*", {}, op)]
    if op == "RunInstances":
        return _run_instances(call)
    if op == "TerminateInstances":
        return [_existing(call, "instance", i) for i in p["InstanceIds"]]
    if op == "CreateSecurityGroup":
        made = _creating(call, "security-group", _requested_tags(p, "security-group"))
        return [*made, Request(f"ec2:{op}", _arn(call, "vpc", p["VpcId"]), {}, op)]
    if op in ("AuthorizeSecurityGroupIngress", "RevokeSecurityGroupIngress",
              "UpdateSecurityGroupRuleDescriptionsIngress", "DeleteSecurityGroup"):  # fmt: skip
        return [_existing(call, "security-group", p["GroupId"])]
    if op == "ImportKeyPair":
        return [Request(f"ec2:{op}", _arn(call, "key-pair", p["KeyName"]), {}, op)]
    raise ValueError(f"no IAM authorization known for ec2:{op}: describe it in {__name__}")


def _role_arn(call: Call) -> str:
    """The ARN of the role the IAM call names: as IAM knows it, or as CreateRole makes it."""
    p = call.params
    return call.role_arn or f"arn:aws:iam::{ACCOUNT}:role{p.get('Path', '/')}{p['RoleName']}"


def _profile_arn(call: Call) -> str:
    p = call.params
    path = p.get("Path") or "/orch-node/"  # orch's profiles all live there
    return f"arn:aws:iam::{ACCOUNT}:instance-profile{path}{p['InstanceProfileName']}"


def _iam(call: Call) -> list[Request]:
    op, p = call.operation, call.params
    action = f"iam:{op}"
    if op in ("GetRole", "GetInstanceProfile"):
        raise ValueError(f"orch makes no iam:{op} call: describe it in {__name__} if it does")
    if op == "CreateRole":
        tags = {t["Key"]: t["Value"] for t in p.get("Tags") or []}
        keys: dict[str, Value] = {**_tag_keys("aws:RequestTag", tags), "aws:TagKeys": tuple(tags)}
        boundary = {"iam:PermissionsBoundary": p["PermissionsBoundary"]}
        out = [Request(action, _role_arn(call), {**keys, **boundary}, op)]
        return out + [Request("iam:TagRole", _role_arn(call), keys, op)] if tags else out
    if op in ("AttachRolePolicy", "DetachRolePolicy"):
        return [Request(action, _role_arn(call), {"iam:PolicyARN": p["PolicyArn"]}, op)]
    if op in ("DeleteRole", "ListRoleTags"):
        tags = call.tags.get(p["RoleName"], {})
        return [Request(action, _role_arn(call), _tag_keys("aws:ResourceTag", tags), op)]
    if op in ("CreateInstanceProfile", "RemoveRoleFromInstanceProfile", "DeleteInstanceProfile"):
        return [Request(action, _profile_arn(call), {}, op)]
    if op == "AddRoleToInstanceProfile":  # IAM also asks for PassRole on the role
        return [Request(action, _profile_arn(call), {}, op),
                Request("iam:PassRole", _role_arn(call), {}, op)]  # fmt: skip
    if op == "ListInstanceProfiles":
        prefix = p.get("PathPrefix", "/")
        return [Request(action, f"arn:aws:iam::{ACCOUNT}:instance-profile{prefix}*", {}, op)]
    raise ValueError(f"no IAM authorization known for iam:{op}: describe it in {__name__}")


def authorizations(calls: list[Call]) -> list[Request]:
    """The IAM requests that `calls` need allowed, in order."""
    out: list[Request] = []
    for call in calls:
        if call.service == "ec2":
            out += _ec2(call)
        elif call.service == "iam":
            out += _iam(call)
        elif call.service == "sts" and call.operation == "GetCallerIdentity":
            continue  # needs no permission
        else:
            raise ValueError(f"no IAM authorization known for {call.service}:{call.operation}")
    return out


def operations(calls: list[Call]) -> set[str]:
    """`service:Operation` of each call."""
    return {f"{c.service}:{c.operation}" for c in calls}
