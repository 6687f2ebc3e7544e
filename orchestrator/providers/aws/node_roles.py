"""A role of its own for the nodes of each job with a checkpoint store: they reach only the job's
prefix of the store (`<prefix>/<job id>/`), never another job's checkpoints.

Why a role per job: a node's AWS credentials come from its instance profile, and IAM sees only
what that role carries. The role's tags become the requests' `aws:PrincipalTag/*`; the instance's
tags never do (EC2 passes no session tags when it takes the role for an instance), and
`ec2:SourceInstanceARN` names the instance, not its job. So one role shared by every job's nodes
cannot tell one job's nodes from another's, and a policy cannot name "this job's prefix" for it.

How: infra/ makes one managed policy (`node_job_policy` output, `aws.node_job_policy`) whose S3
statements name `<prefix>/${aws:PrincipalTag/orch-job}/*`. For a launch of a job with a store,
`ensure_job_profile` makes, when missing, the role `orch-job-<digest>` under the path
`/orch-node/`, tagged `orch-job = <job id>` (and `orch-owner`), with that policy attached and as
its permissions boundary (the only policy the identity that makes it may attach, so no such role
can ever hold more), and an instance profile of the same name holding it. The nodes launch with
that profile.

Limits: a kept cluster's nodes outlive their jobs and serve jobs whose ids are not known when
they launch, so they keep the shared `aws.instance_profile` (the whole store prefix). IAM is
eventually consistent: EC2 may refuse a new profile for some seconds, which the launch waits out
(`PROFILE_READY_S`). Roles and profiles cost nothing; an account holds 1,000 roles by default,
and each job holds one while its nodes live.

Lifecycle: made by the job's first launch (a recovery's launch finds it), deleted by
`AwsProvider.terminate` once no live instance holds the profile (`delete_job_profile`); one left
behind is deleted by the owner's next launch or terminate once `LEAK_GRACE_S` old (`sweep`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from orchestrator.providers.aws.cluster_network import LEAK_GRACE_S
from orchestrator.providers.aws.ec2_requests import TAG_JOB, TAG_LEDGER, TAG_OWNER, error_code

PATH = "/orch-node/"
NAME_PREFIX = "orch-job-"
PROFILE_READY_S = 90.0  # how long a launch waits for EC2 to see a new instance profile
PROFILE_RETRY_S = 5.0
TRUST = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                   "Action": "sts:AssumeRole"}],
})  # fmt: skip


def job_profile_name(ledger_id: str | None, job_id: str) -> str:
    """The role and instance profile of job `job_id` of ledger `ledger_id` (64 characters at
    most, as IAM wants). Pure."""
    digest = hashlib.sha256(f"{ledger_id or ''}\x1f{job_id}".encode()).hexdigest()[:24]
    return NAME_PREFIX + digest


def is_job_profile(name: str | None) -> bool:
    """Whether instance profile `name` is a job's own (`job_profile_name`). Pure."""
    return bool(name) and str(name).startswith(NAME_PREFIX)


def profile_not_ready(exc: BaseException) -> bool:
    """Whether RunInstances refused an instance profile EC2 does not see yet (IAM is eventually
    consistent: a profile made a moment ago). Pure."""
    return error_code(exc) == "InvalidParameterValue" and "iamInstanceProfile" in str(exc)


def _tolerant(call: Any, tolerated: tuple[str, ...], **kwargs: Any) -> None:
    try:
        call(**kwargs)
    except ClientError as exc:
        if error_code(exc) not in tolerated:
            raise


def ensure_job_profile(
    iam: Any, *, job_id: str, ledger_id: str | None, owner: str, policy_arn: str
) -> str:
    """The name of job `job_id`'s instance profile, made with its role when missing (see the
    module docstring). Idempotent: what a concurrent launch of the job made is taken."""
    name = job_profile_name(ledger_id, job_id)
    tags = {TAG_JOB: job_id, TAG_OWNER: owner}
    if ledger_id is not None:
        tags[TAG_LEDGER] = ledger_id
    exists = ("EntityAlreadyExists",)
    _tolerant(iam.create_role, exists, RoleName=name, Path=PATH, AssumeRolePolicyDocument=TRUST,
              PermissionsBoundary=policy_arn, Description=f"orch job {job_id}: its store prefix",
              Tags=[{"Key": k, "Value": v} for k, v in tags.items()])  # fmt: skip
    iam.attach_role_policy(RoleName=name, PolicyArn=policy_arn)
    _tolerant(iam.create_instance_profile, exists, InstanceProfileName=name, Path=PATH)
    # a profile holds one role: LimitExceeded means it holds this one already
    _tolerant(iam.add_role_to_instance_profile, ("LimitExceeded",),
              InstanceProfileName=name, RoleName=name)  # fmt: skip
    return name


def delete_job_profile(iam: Any, name: str, policy_arn: str | None) -> bool:
    """Delete job profile `name` and its role; True when both are gone (what is gone already
    counts), False when IAM refuses (left to `sweep`)."""
    gone = ("NoSuchEntity",)
    try:
        _tolerant(iam.remove_role_from_instance_profile, gone,
                  InstanceProfileName=name, RoleName=name)  # fmt: skip
        _tolerant(iam.delete_instance_profile, gone, InstanceProfileName=name)
        if policy_arn is not None:
            _tolerant(iam.detach_role_policy, gone, RoleName=name, PolicyArn=policy_arn)
        _tolerant(iam.delete_role, gone, RoleName=name)
    except ClientError:
        return False
    return True


def job_profiles_of(descriptions: Iterable[dict[str, Any]]) -> set[str]:
    """The job profiles (names) the described instances hold. Pure."""
    found = set()
    for desc in descriptions:
        arn = (desc.get("IamInstanceProfile") or {}).get("Arn") or ""
        name = arn.rsplit("/", 1)[-1]
        if f":instance-profile{PATH}" in arn and name.startswith(NAME_PREFIX):
            found.add(name)
    return found


def sweep(
    iam: Any, owner: str, in_use: set[str], policy_arn: str | None, now: datetime | None = None
) -> list[str]:
    """Delete `owner`'s job profiles (and roles) that no live instance holds (`in_use`: the
    names live instances hold) and that are `LEAK_GRACE_S` old; another owner's are never
    touched. Returns the names deleted."""
    now = now or datetime.now(UTC)
    deleted = []
    pages = iam.get_paginator("list_instance_profiles").paginate(PathPrefix=PATH)
    for profile in (p for page in pages for p in page["InstanceProfiles"]):
        name = profile["InstanceProfileName"]
        made = profile["CreateDate"]
        if name in in_use or not name.startswith(NAME_PREFIX):
            continue
        if now - made.astimezone(UTC) < timedelta(seconds=LEAK_GRACE_S):
            continue
        try:
            tags = iam.list_role_tags(RoleName=name)["Tags"]
        except ClientError:
            continue
        if {t["Key"]: t["Value"] for t in tags}.get(TAG_OWNER) != owner:
            continue
        if delete_job_profile(iam, name, policy_arn):
            deleted.append(name)
    return deleted
