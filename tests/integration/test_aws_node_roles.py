"""Each job's nodes get a role of their own that reaches only the job's prefix of the checkpoint
store, against a moto server on 127.0.0.1 (IAM and EC2); what that role may do is judged offline
by the per-job policy of infra/policies/ (`tests/support/iam_eval.py`), since moto enforces no
IAM."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest

from orchestrator.errors import ConfigError
from orchestrator.node.guard_protocol import GuardTerms
from orchestrator.providers.aws import node_roles
from orchestrator.providers.aws.node_roles import job_profile_name
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec
from tests.support.aws_moto import REGION, make_provider, request, running
from tests.support.iam_eval import Request, allows
from tests.support.policy_templates import render

pytestmark = pytest.mark.timeout(60)

STORE = "s3://my-bucket/orch"
JOB_POLICY = {
    "job_objects": "arn:aws:s3:::my-bucket/orch/${aws:PrincipalTag/orch-job}/*",
    "job_list_prefix": "orch/${aws:PrincipalTag/orch-job}/*",
    "store_bucket_arn": "arn:aws:s3:::my-bucket",
}


def job_policy(endpoint: str) -> str:
    """infra/'s per-job node policy and the shared node profile, made in moto as infra/ does;
    returns the policy's ARN."""
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION)
    document = json.dumps(render("node-job", **JOB_POLICY))
    arn = iam.create_policy(PolicyName="orch-node-job", PolicyDocument=document)["Policy"]["Arn"]
    iam.create_role(RoleName="orch-node", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="orch-node")
    iam.add_role_to_instance_profile(InstanceProfileName="orch-node", RoleName="orch-node")
    return str(arn)


@pytest.fixture
def provider(tmp_path: Path, moto_endpoint: str) -> AwsProvider:
    policy = job_policy(moto_endpoint)
    return make_provider(tmp_path, moto_endpoint, instance_profile="orch-node",
                         node_job_policy=policy)  # fmt: skip


def _profile_of(provider: AwsProvider, instance_id: str) -> str:
    [desc] = [d for d in running(provider) if d["InstanceId"] == instance_id]
    return str(desc["IamInstanceProfile"]["Arn"])


def _job_profiles(provider: AwsProvider) -> list[str]:
    """The job profiles IAM holds (moto ignores PathPrefix: the names tell them apart)."""
    found = provider.iam_client().list_instance_profiles(PathPrefix="/orch-node/")
    names = [p["InstanceProfileName"] for p in found["InstanceProfiles"]]
    return [n for n in names if n.startswith(node_roles.NAME_PREFIX)]


def _role(provider: AwsProvider, name: str) -> dict[str, Any]:
    iam = provider.iam_client()
    role = iam.get_role(RoleName=name)["Role"]
    role["Tags"] = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]}
    role["Attached"] = [
        p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
    ]
    return role


def _kept_guard(job_id: str) -> GuardTerms:
    """The guard terms of a kept cluster's nodes (`autostop`)."""
    return GuardTerms(
        job_id=job_id, interval_s=5, silence_s=15, allowance_s=60, deadman_s=600,
        stop_grace_s=30, upload_wait_s=10, idle_util_pct=5, idle_cpu_pct=5, autostop=True,
    )  # fmt: skip


def _reaches(role_tags: dict[str, str], action: str, key: str) -> bool:
    """Whether a node holding a role with these tags may `action` the store's object `key`,
    under the per-job policy."""
    context = {f"aws:PrincipalTag/{k}": v for k, v in role_tags.items()}
    policy = render("node-job", **JOB_POLICY)
    return allows(policy, Request(action, f"arn:aws:s3:::my-bucket/{key}", context))


def test_each_job_s_nodes_reach_only_their_job_s_prefix(provider: AwsProvider) -> None:
    job1 = provider.launch(request(job="job1", count=2, store=STORE))
    job2 = provider.launch(request(job="job2", count=1, store=STORE))
    names = {"job1": job_profile_name(None, "job1"), "job2": job_profile_name(None, "job2")}
    assert names["job1"] != names["job2"]
    for job, nodes in (("job1", job1), ("job2", job2)):
        for node in nodes:
            assert _profile_of(provider, node.instance_id).endswith(f"/orch-node/{names[job]}")
            assert node.credentials
        role = _role(provider, names[job])
        assert role["Tags"]["orch-job"] == job and role["Tags"]["orch-owner"] == "tester"
        assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == provider.aws.node_job_policy
        assert role["Attached"] == [provider.aws.node_job_policy]
        assert role["Path"] == "/orch-node/"
    one, two = _role(provider, names["job1"])["Tags"], _role(provider, names["job2"])["Tags"]
    for action in ("s3:GetObject", "s3:PutObject"):
        assert _reaches(one, action, "orch/job1/ckpt/model.pt@0123")
        assert not _reaches(one, action, "orch/job2/ckpt/model.pt@0123")
        assert not _reaches(two, action, "orch/job1/ckpt/model.pt@0123")
        assert not _reaches(one, action, "orch/job10/x") and not _reaches(one, action, "other")


def _document(provider: AwsProvider, arn: str) -> dict[str, Any]:
    """A managed policy's default document, as IAM holds it."""
    iam = provider.iam_client()
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]
    raw = document["Document"]
    return json.loads(unquote(raw)) if isinstance(raw, str) else dict(raw)


ECR_PULL = ("ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
            "ecr:BatchCheckLayerAvailability")  # fmt: skip


def test_a_job_s_nodes_may_pull_images_from_ecr_and_nothing_more(provider: AwsProvider) -> None:
    """A job's container image in Amazon ECR: its nodes log in (`aws ecr get-login-password`)
    and pull with their own role, whose policy is also its boundary."""
    provider.launch(request(job="job1", count=1, store=STORE, container=True))
    role = _role(provider, job_profile_name(None, "job1"))
    boundary = role["PermissionsBoundary"]["PermissionsBoundaryArn"]
    context = {f"aws:PrincipalTag/{k}": v for k, v in role["Tags"].items()}
    repository = "arn:aws:ecr:us-east-1:123456789012:repository/team/train"
    for arn in {*role["Attached"], boundary}:
        policy = _document(provider, arn)
        assert allows(policy, Request("ecr:GetAuthorizationToken", "*", context))
        for action in ECR_PULL[1:]:
            assert allows(policy, Request(action, repository, context))
        for action in ("ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:DeleteRepository",
                       "ecr:SetRepositoryPolicy"):  # fmt: skip
            assert not allows(policy, Request(action, repository, context))


ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:v1"


def _container_spec(image: str, **container: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "t", "workdir": ".", "run": "python train.py",
        "resources": {"accelerator": "A10G", "nodes": 1},
        "secrets": {"REGISTRY_TOKEN": "x"}, "container": {"image": image, **container},
    })  # fmt: skip


def test_an_ecr_image_without_a_store_gives_the_nodes_their_job_s_role(
    provider: AwsProvider,
) -> None:
    """`aws ecr get-login-password` on the nodes needs a role: a job whose image is in ECR
    gets its own, store or not; an image elsewhere, or a login from `secrets`, gets none."""
    ecr = launch_request(_container_spec(ECR_IMAGE), "job1", public_key=request().public_key)
    assert ecr.ecr_login and ecr.store is None
    (node,) = provider.launch(ecr)
    name = job_profile_name(None, "job1")
    assert _profile_of(provider, node.instance_id).endswith(f"/orch-node/{name}")
    assert node.credentials
    role = _role(provider, name)
    assert role["Tags"]["orch-job"] == "job1"
    context = {f"aws:PrincipalTag/{k}": v for k, v in role["Tags"].items()}
    assert allows(_document(provider, role["Attached"][0]),
                  Request("ecr:GetAuthorizationToken", "*", context))  # fmt: skip
    login = {"username": "AWS", "password_secret": "REGISTRY_TOKEN"}
    for spec in (_container_spec("nvcr.io/nvidia/pytorch:24.05-py3"),
                 _container_spec(ECR_IMAGE, credentials=login)):  # fmt: skip
        plain = launch_request(spec, "job2", public_key=request().public_key)
        assert not plain.ecr_login
        (node,) = provider.launch(plain)
        assert not node.credentials
    kept = _kept_guard("dev-ecr")
    (node,) = provider.launch(request(job="dev-ecr", count=1, ecr_login=True, guard=kept))
    assert _profile_of(provider, node.instance_id).endswith(":instance-profile/orch-node")


def test_an_ecr_image_without_any_node_role_configured_is_refused_before_a_launch(
    tmp_path: Path, moto_endpoint: str
) -> None:
    provider = make_provider(tmp_path, moto_endpoint)
    with pytest.raises(ConfigError) as refused:
        provider.launch(request(job="job1", count=1, ecr_login=True))
    said = f"{refused.value} {refused.value.hint}"
    assert "Amazon ECR" in said and "container.credentials" in said
    assert "ORCH_AWS_INSTANCE_PROFILE" in said
    assert running(provider) == []


def test_a_job_s_role_ends_with_its_last_node(provider: AwsProvider) -> None:
    nodes = provider.launch(request(job="job1", count=2, store=STORE))
    name = job_profile_name(None, "job1")
    provider.terminate([nodes[1].instance_id])  # a lost node: the survivor keeps the role
    assert _role(provider, name)["Tags"]["orch-job"] == "job1"
    provider.terminate([nodes[0].instance_id])
    assert _job_profiles(provider) == []
    assert not [r for r in provider.iam_client().list_roles()["Roles"] if r["RoleName"] == name]


def test_a_kept_cluster_s_nodes_keep_the_shared_profile(provider: AwsProvider) -> None:
    """A kept cluster's later jobs are not known when its nodes launch: no job role can name
    their prefixes."""
    kept = _kept_guard("dev-3f9c1a")
    (node,) = provider.launch(request(job="dev-3f9c1a", count=1, store=STORE, guard=kept))
    assert _profile_of(provider, node.instance_id).endswith(":instance-profile/orch-node")
    assert _job_profiles(provider) == []


def test_job_roles_left_behind_are_swept_once_old_and_only_the_owner_s(
    provider: AwsProvider,
) -> None:
    iam, policy = provider.iam_client(), provider.aws.node_job_policy
    assert policy is not None
    mine = node_roles.ensure_job_profile(iam, job_id="gone", ledger_id=None, owner="tester",
                                         policy_arn=policy)  # fmt: skip
    theirs = node_roles.ensure_job_profile(iam, job_id="other", ledger_id=None, owner="bob",
                                           policy_arn=policy)  # fmt: skip
    assert node_roles.sweep(iam, "tester", set(), policy) == []  # too young
    later = datetime.now(UTC) + timedelta(hours=2)
    assert node_roles.sweep(iam, "tester", {mine}, policy, now=later) == []  # a node holds it
    assert node_roles.sweep(iam, "tester", set(), policy, now=later) == [mine]
    assert _job_profiles(provider) == [theirs]


def test_a_launch_waits_while_ec2_does_not_see_the_new_profile_yet(
    tmp_path: Path, moto_endpoint: str
) -> None:
    """IAM is eventually consistent: EC2 refuses a profile made a moment ago, for a while."""
    from botocore.awsrequest import AWSResponse

    from tests.support.aws_moto import ec2_error

    policy = job_policy(moto_endpoint)
    slept: list[float] = []
    settings = make_provider(tmp_path, moto_endpoint, instance_profile="orch-node",
                             node_job_policy=policy).settings  # fmt: skip
    provider = AwsProvider(settings, sleep=slept.append)
    refusals = []

    def profile_refusal(url: str) -> AWSResponse:
        answer = ec2_error(url, 400, "InvalidParameterValue")
        answer.raw.data = answer.raw.data.replace(
            b"injected", b"Value (orch-job-x) for parameter iamInstanceProfile.name is invalid."
        )
        return answer

    def not_yet(request: Any, **_: Any) -> AWSResponse | None:
        if len(refusals) < 4:  # more than aws.max_api_attempts (3): not counted as failed tries
            refusals.append(request.url)
            return profile_refusal(request.url)
        return None

    provider.launch_client(REGION).meta.events.register("before-send.ec2.RunInstances", not_yet)
    (node,) = provider.launch(request(job="job1", count=1, store=STORE))
    assert len(refusals) == 4 and slept.count(node_roles.PROFILE_RETRY_S) == 4
    assert node.credentials
