"""Each node's pull, from the spec's container section and the node's runtime."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from orchestrator.control.run.image_step import pull_plans
from orchestrator.control.run.launcher import container_job
from orchestrator.errors import ContainerError
from orchestrator.node.container import ContainerRuntime
from orchestrator.node.launch import NodeLayout
from orchestrator.providers.base import Instance
from orchestrator.spec.model import JobSpec

DOCKER = ContainerRuntime(kind="docker", command="sudo -n docker", gpu_options=("--gpus", "all"))
ECR = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/train:7"


def node(rank: int, runtime: ContainerRuntime | None = DOCKER) -> Instance:
    return Instance(
        instance_id=f"i-{rank}", job_id="j", cluster="j", rank=rank, private_ip=f"10.0.0.{rank}",
        ssh_host="127.0.0.1", ssh_port=22, ssh_user="orch", host_key="ssh-ed25519 K",
        interface="eth0", market="spot", instance_type="g5.12xlarge",
        price_per_hour=Decimal("1.70"), launched_at=datetime(2026, 1, 1, tzinfo=UTC),
        container_runtime=runtime,
    )  # fmt: skip


def spec(**container: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "boxed", "workdir": ".", "run": "python train.py",
            "data": [{"src": "d", "dst": "~/data"}, {"src": "e", "dst": "/mnt/e"}],
            "checkpoint": {"dir": "/scratch/ckpt"},
            "container": {"image": ECR, **container},
            "secrets": {"REGISTRY_TOKEN": "t0ken"},
        }
    )  # fmt: skip


def test_an_ecr_image_without_credentials_logs_in_with_the_node_role() -> None:
    (plan,) = pull_plans(spec(), NodeLayout("j"), [node(0)])
    assert (plan.ecr_region, plan.username, plan.registry) == (
        "eu-west-1",
        None,
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
    )
    assert plan.needs_torchrun and not plan.always
    assert plan.auth_dir == '"$HOME"/orch-jobs/j/run/registry-auth'


def test_credentials_win_over_the_role_and_podman_never_uses_aws() -> None:
    login = {"credentials": {"username": "bot", "password_secret": "REGISTRY_TOKEN"}}
    (plan,) = pull_plans(spec(**login, pull="always"), NodeLayout("j"), [node(0)])
    assert (plan.ecr_region, plan.username, plan.always) == (None, "bot", True)
    podman = replace(DOCKER, kind="podman", command="podman")
    (plan,) = pull_plans(spec(), NodeLayout("j"), [node(0, podman)])
    assert plan.ecr_region is None


def test_nodes_that_cannot_run_containers_are_named() -> None:
    with pytest.raises(ContainerError, match="i-1") as caught:
        pull_plans(spec(), NodeLayout("j"), [node(0), node(1, None)])
    assert "namespace mode" in (caught.value.hint or "")


def test_the_container_mounts_the_jobs_paths_where_the_job_sees_them() -> None:
    job = container_job(spec(shm_size="8g"), NodeLayout("j"), "/scratch/ckpt/step-40")
    assert job is not None
    assert job.mounts == ("data", "/mnt/e", "/scratch/ckpt")
    assert (job.image, job.shm_size) == (ECR, "8g")
    assert container_job(JobSpec.model_validate(
        {"name": "bare", "workdir": ".", "run": "x"}), NodeLayout("j"), "") is None  # fmt: skip
