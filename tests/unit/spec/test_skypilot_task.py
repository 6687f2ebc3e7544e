"""SkyPilot task files read as orch job specs: the shared fields map over, `run` keeps
SkyPilot's meaning (once per node, `launcher: none`), and every field orch cannot honour is
refused by its own name and line, never ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.loading import load_job
from orchestrator.spec.skypilot import from_skypilot, looks_like_skypilot, task_loc
from tests.unit.spec_cases import FULL_EXAMPLE, MINIMAL, write

TASK = """\
name: minGPT_DDP
workdir: .
num_nodes: 2
resources:
  accelerators: A10G:4
  use_spot: true
  disk_size: 256
  cloud: aws
  region: us-east-1
  zone: us-east-1b
  instance_type: g5.12xlarge
  image_id: ami-0868a20f5a3bf9702
  ports: 8081
envs:
  LR: "3e-4"
file_mounts:
  /data: ./data
setup: pip install -r requirements.txt
run: |
  MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  torchrun --nnodes=$SKYPILOT_NUM_NODES --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE \\
    --node_rank=$SKYPILOT_NODE_RANK --master_addr=$MASTER_ADDR --master_port=8008 main.py
budget: {max_cost_usd: 40}
"""


def test_a_skypilot_task_loads_as_the_job_it_means(project: Path) -> None:
    (project / "data").mkdir(exist_ok=True)
    job = load_job(write(project, TASK))
    spec = job.spec
    assert spec.name == "mingpt-ddp" and spec.launcher == "none" and spec.provider == "aws"
    assert spec.resources.nodes == 2 and spec.resources.gpus_per_node == 4
    assert spec.resources.accelerator == "A10G" and spec.resources.spot is True
    assert spec.resources.disk_size_gb == 256
    assert spec.resources.region == ["us-east-1"] and spec.resources.zone == ["us-east-1b"]
    assert spec.resources.instance_type == ["g5.12xlarge"]
    assert spec.resources.image == "ami-0868a20f5a3bf9702" and spec.resources.ports == ["8081"]
    assert dict(spec.env) == {"LR": "3e-4"}
    assert [(d.src, d.dst) for d in spec.data] == [("./data", "/data")]
    assert spec.run.startswith('MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS"')
    assert spec.budget.max_cost_usd == 40  # orch's own sections may be added


def test_infra_names_the_cloud_and_may_name_its_region_and_zone() -> None:
    spec, problems = from_skypilot({"resources": {"infra": "aws/us-west-2/us-west-2b"}}, "t")
    assert problems == [] and spec["provider"] == "aws"
    assert spec["resources"] == {"region": "us-west-2", "zone": "us-west-2b"}


@pytest.mark.parametrize(
    ("accelerators", "name", "count"),
    [("A10G", "A10G", 1), ("H100:8", "H100", 8), ({"L4": 2}, "L4", 2)],
)
def test_each_way_of_writing_one_accelerator(accelerators: object, name: str, count: int) -> None:
    spec, problems = from_skypilot({"resources": {"accelerators": accelerators}, "run": "x"}, "t")
    assert problems == []
    assert spec["resources"] == {"accelerator": name, "gpus_per_node": count}


@pytest.mark.parametrize(
    ("task", "field", "words"),
    [
        (
            "num_nodes: 1\nresources: {cpus: 4+}",
            "resources.cpus",
            "does not support this SkyPilot field",
        ),
        ("num_nodes: 1\nresources: {image_id: ami-1}", "resources.image_id", "AMI id"),
        ("num_nodes: 1\nresources: {disk_tier: best}", "resources.disk_tier", "does not support"),
        ("num_nodes: 1\nresources: {any_of: [{}]}", "resources.any_of", "does not support"),
        ("resources: {accelerators: [A10G, L4]}", "resources.accelerators", "one accelerator"),
        ("resources: {cloud: gcp}", "resources.cloud", "runs on aws"),
        ("resources: {infra: azure/eastus}", "resources.infra", "runs on aws"),
        ("num_nodes: 0", "num_nodes", "must be >= 1"),
        ("resources: {use_spot: maybe}", "resources.use_spot", ""),
        ("envs: {HF_TOKEN: null}", "envs.HF_TOKEN", "has no value"),
        ("file_mounts: {/ds: gs://bucket/x}", "file_mounts./ds", "gs:// sources are not"),
        ("file_mounts: {/ds: {source: r2://b/x}}", "file_mounts./ds", "r2:// sources are not"),
        ("file_mounts: {/ds: {name: my-bkt, source: ./d}}", "file_mounts./ds", "creates no"),
        ("file_mounts: {/ds: {source: s3://bkt, mode: SYNC}}", "file_mounts./ds", "COPY, MOUNT"),
        ("file_mounts: {/ds: {mode: COPY}}", "file_mounts./ds", "give a local path or an s3"),
        ("file_mounts: [/ds]", "file_mounts", "must map node paths"),
        ("num_nodes: 1\nservice: {replicas: 2}", "service", "not services"),
        ("num_nodes: 1\nenv: {A: b}", "env", "envs"),
    ],
)
def test_a_field_orch_cannot_honour_is_refused_by_its_name_and_line(
    project: Path, task: str, field: str, words: str
) -> None:
    text = f"name: t\nworkdir: .\nrun: python main.py\n{task}\n"
    with pytest.raises(SpecError) as refused:
        load_job(write(project, text))
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert f"{field} (line 4" in message or f"{field} (line 5" in message, message
    assert words in message, message


def test_orch_s_own_specs_are_not_read_as_tasks(project: Path) -> None:
    for text in (FULL_EXAMPLE, MINIMAL):
        assert load_job(write(project, text)).spec.launcher == "torchrun"
    assert not looks_like_skypilot({"name": "x", "run": "y", "resources": {"nodes": 2}})
    # `image_id` alone may be a slip for orch's `image`: it stays an unknown field there
    assert not looks_like_skypilot({"resources": {"image_id": "ami-1"}})
    assert looks_like_skypilot({"resources": {"image_id": "docker:ubuntu"}})


def test_a_task_without_name_or_workdir_takes_the_file_s_name_and_its_folder() -> None:
    spec, problems = from_skypilot({"num_nodes": 1, "run": "x"}, "My Task_v2")
    assert problems == [] and spec["name"] == "my-task-v2" and spec["workdir"] == "."
    assert from_skypilot({"num_nodes": 1, "run": "x"}, "2024-run")[0]["name"] == "task-2024-run"


def test_errors_found_by_orch_s_own_checks_point_at_the_task_s_fields() -> None:
    assert task_loc(("resources", "nodes")) == ("num_nodes",)
    assert task_loc(("resources", "spot")) == ("resources", "use_spot")
    assert task_loc(("env", "LR")) == ("envs", "LR")
    assert task_loc(("data", 0, "src")) == ("file_mounts",)
    assert task_loc(("run",)) == ("run",)


ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
DOCKER_TASK = """\
name: t
workdir: .
run: python main.py
resources:
  image_id: {image_id}
"""


def test_a_docker_image_id_is_the_job_s_container(project: Path) -> None:
    text = DOCKER_TASK.format(image_id="docker:nvcr.io/nvidia/pytorch:24.05-py3")
    spec = load_job(write(project, text), environ={}).spec
    assert spec.container is not None and spec.resources.image is None
    assert spec.container.image == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert spec.container.credentials is None and spec.launcher == "none"


def test_an_image_id_without_docker_stays_the_nodes_ami(project: Path) -> None:
    text = DOCKER_TASK.format(image_id="ami-0868a20f5a3bf9702") + "num_nodes: 1\n"
    spec = load_job(write(project, text)).spec
    assert spec.resources.image == "ami-0868a20f5a3bf9702" and spec.container is None


def test_skypilot_s_login_variables_are_the_container_s_credentials(project: Path) -> None:
    text = DOCKER_TASK.format(image_id="docker:team/train:1") + (
        "envs:\n"
        "  SKYPILOT_DOCKER_USERNAME: AWS\n"
        f"  SKYPILOT_DOCKER_SERVER: {ECR}\n"
        "  SKYPILOT_DOCKER_PASSWORD:\n"  # SkyPilot's `--env NAME`: from the shell
    )
    job = load_job(write(project, text), environ={"SKYPILOT_DOCKER_PASSWORD": "tok-3a9c"})
    container = job.spec.container
    assert container is not None and container.credentials is not None
    assert container.image == f"{ECR}/team/train:1"  # SkyPilot pulls it from the server
    assert container.credentials.username == "AWS"
    assert container.credentials.password_secret == "SKYPILOT_DOCKER_PASSWORD"
    assert job.spec.secrets == {"SKYPILOT_DOCKER_PASSWORD": "tok-3a9c"}
    assert "SKYPILOT_DOCKER_PASSWORD" not in job.spec.env  # env values are shown; it is not
    assert "tok-3a9c" not in str(job.spec.public_document())


def test_a_password_under_secrets_and_a_docker_hub_server_keep_the_image(project: Path) -> None:
    text = DOCKER_TASK.format(image_id="docker:team/train:1") + (
        "envs: {SKYPILOT_DOCKER_USERNAME: bot, SKYPILOT_DOCKER_SERVER: docker.io}\n"
        "secrets: {SKYPILOT_DOCKER_PASSWORD: null}\n"
    )
    spec = load_job(write(project, text), environ={"SKYPILOT_DOCKER_PASSWORD": "p"}).spec
    assert spec.container is not None and spec.container.image == "team/train:1"
    assert spec.container.credentials is not None
    assert spec.container.credentials.password_secret == "SKYPILOT_DOCKER_PASSWORD"


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        (
            "envs: {SKYPILOT_DOCKER_USERNAME: bot, SKYPILOT_DOCKER_SERVER: ghcr.io}",
            "envs",
            "give SKYPILOT_DOCKER_PASSWORD too",
        ),
        (
            "secrets: {SKYPILOT_DOCKER_USERNAME: null, SKYPILOT_DOCKER_PASSWORD: null}",
            "envs.SKYPILOT_DOCKER_USERNAME",
            "write the registry user in the file",
        ),
        (
            "envs: {SKYPILOT_DOCKER_SERVER: ghcr.io}\ncontainer: {image: a}",
            "resources.image_id",
            "give the image once",
        ),
    ],
)
def test_a_login_orch_cannot_take_as_written_is_refused_saying_what_to_give(
    project: Path, extra: str, field: str, words: str
) -> None:
    text = DOCKER_TASK.format(image_id="docker:team/train:1") + extra + "\n"
    with pytest.raises(SpecError) as refused:
        load_job(write(project, text), environ={"SKYPILOT_DOCKER_PASSWORD": "p"})
    assert f"{field} (line" in str(refused.value) and words in str(refused.value), refused.value


def test_a_server_other_than_the_image_s_registry_is_refused(project: Path) -> None:
    text = DOCKER_TASK.format(image_id="docker:nvcr.io/nvidia/pytorch:24.05-py3") + (
        "envs: {SKYPILOT_DOCKER_SERVER: ghcr.io}\n"
    )
    with pytest.raises(SpecError) as refused:
        load_job(write(project, text))
    said = str(refused.value)
    assert "resources.image_id (line 5): the image is in nvcr.io, but" in said, said


def test_an_invalid_docker_image_is_reported_at_the_image_id(project: Path) -> None:
    with pytest.raises(SpecError) as refused:
        load_job(write(project, DOCKER_TASK.format(image_id="docker:Team/Train")))
    assert "resources.image_id (line 5): invalid repository" in str(refused.value)


def test_s3_file_mounts_become_bucket_data_and_a_mount_says_it_is_copied(project: Path) -> None:
    text = (
        "name: t\nworkdir: .\nrun: python main.py\nfile_mounts:\n"
        "  /data/raw: s3://training-sets/raw/\n"
        "  ~/copied: {source: s3://training-sets/copied, mode: COPY}\n"
        "  /data/mounted: {source: s3://training-sets/mounted, mode: MOUNT}\n"
        "  /data/cached: {source: s3://training-sets/cached, mode: MOUNT_CACHED}\n"
        "  /data/local: ./data\n"
    )
    job = load_job(write(project, text))
    assert [(m.src, m.dst) for m in job.spec.data] == [
        ("s3://training-sets/raw", "/data/raw"),
        ("s3://training-sets/copied", "~/copied"),
        ("s3://training-sets/mounted", "/data/mounted"),
        ("s3://training-sets/cached", "/data/cached"),
        ("./data", "/data/local"),
    ]
    assert job.data_sources == [None, None, None, None, (project / "data").resolve()]
    assert len(job.notices) == 2
    mounted, cached = job.notices
    assert mounted.startswith("file_mounts./data/mounted: orch copies s3://training-sets/mounted")
    assert "instead of mounting it (MOUNT)" in mounted
    assert "(MOUNT_CACHED)" in cached
    assert load_job(write(project, FULL_EXAMPLE)).notices == ()
