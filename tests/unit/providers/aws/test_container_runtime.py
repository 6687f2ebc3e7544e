"""EC2 nodes run a job's image with Docker (every GPU on GPU types), and a launch for a job with
a container installs at boot what the node image lacks: the script runs here against stub
package managers, which record what it asks of them."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from orchestrator.config import AwsSettings, Settings
from orchestrator.node.container import PullPlan, PullProgress, pull_failure, pull_script
from orchestrator.node.guard_protocol import GuardTerms
from orchestrator.providers.aws import container_runtime
from orchestrator.providers.aws.container_runtime import SETUP_LOG, SETUP_SCRIPT, ec2_runtime
from orchestrator.providers.aws.ec2_requests import (
    USER_DATA_LIMIT,
    instance_from_description,
    new_host_key,
    packed,
    user_data,
)
from orchestrator.providers.aws.host_node import host_instance
from orchestrator.providers.aws.node_launcher import NodeLauncher
from orchestrator.providers.aws.provider import AwsProvider
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.offers import Offer
from orchestrator.providers.requests import launch_request
from orchestrator.spec.model import JobSpec

NOW = datetime(2026, 12, 1, 8, tzinfo=UTC)
KEY = "ssh-ed25519 AAAA test"


def _desc(instance_type: str) -> dict:
    return {
        "InstanceId": "i-1",
        "InstanceType": instance_type,
        "PrivateIpAddress": "10.0.0.5",
        "LaunchTime": NOW,
        "Tags": [{"Key": "orch-job", "Value": "j"}, {"Key": "orch-role", "Value": "ctl"}],
    }


def test_ec2_nodes_run_containers_with_docker_and_every_gpu_on_gpu_types(tmp_path: Path) -> None:
    gpu_types = AwsProvider(Settings(home=tmp_path)).gpu_types()
    assert {"g5.xlarge", "p4d.24xlarge"} <= gpu_types and "t3.small" not in gpu_types
    for instance_type, gpus in (("g5.xlarge", ("--gpus", "all")), ("t3.small", ())):
        node = instance_from_description(
            _desc(instance_type), ssh_user="ubuntu", interface="ens5", gpu_types=gpu_types
        )
        host = host_instance(
            _desc(instance_type), "us-east-1", ssh_user="ubuntu", host_key="k",
            gpu_types=gpu_types,
        )  # fmt: skip
        for instance in (node, host):
            assert instance is not None and instance.container_runtime is not None
            runtime = instance.container_runtime
            assert (runtime.kind, runtime.command) == ("docker", "sudo -n docker")
            assert runtime.gpu_options == gpus
            assert SETUP_SCRIPT in runtime.prepare and SETUP_LOG in runtime.prepare


def _guard() -> str:
    terms = GuardTerms(
        job_id="job-1", interval_s=5, silence_s=15, allowance_s=60, deadman_s=600,
        stop_grace_s=30, upload_wait_s=10, idle_util_pct=5, idle_cpu_pct=5,
    )  # fmt: skip
    return terms.for_node(now=NOW, hourly_usd=Decimal(1), poweroff="shutdown -h now",
                          home="/home/ubuntu")  # fmt: skip


def test_user_data_of_a_container_job_installs_after_arming_the_guard_within_ec2s_limit() -> None:
    host_key, guard = new_host_key(), _guard()
    text = user_data(KEY, host_key, guard, container_gpu=True)
    sent = packed(text)
    # the guard alone keeps 3 KiB of room (tests/unit/node/test_guard_program.py); the setup
    # takes at most 1 KiB of it, so a container job's nodes still leave the guard 2 KiB to grow
    assert len(sent) - len(packed(user_data(KEY, host_key, guard))) <= 1024
    assert len(sent) <= USER_DATA_LIMIT - 2048, len(sent)
    assert gzip.decompress(sent).decode() == text
    config = yaml.safe_load(text)
    files = {f["path"]: f for f in config["write_files"]}
    assert "/opt/orch-guard/guard.py" in files and SETUP_SCRIPT in files
    assert files[SETUP_SCRIPT]["content"] == container_runtime.SETUP_TEXT
    guard, setup = (" ".join(c) for c in config["runcmd"])
    assert "orch-guard.service" in guard
    assert f"sh {SETUP_SCRIPT} 1 " in setup and f"tee -a {SETUP_LOG}" in setup
    cpu = yaml.safe_load(user_data(KEY, new_host_key(), container_gpu=False))
    assert [f["path"] for f in cpu["write_files"]] == [SETUP_SCRIPT]
    assert f"sh {SETUP_SCRIPT} 0 " in " ".join(cpu["runcmd"][0])
    for plain in (user_data(KEY, new_host_key()), user_data(KEY, new_host_key(), _guard())):
        assert SETUP_SCRIPT not in plain


def _spec(container: bool) -> JobSpec:
    doc: dict = {"name": "t", "workdir": ".", "run": "python train.py",
                 "resources": {"accelerator": "A10G"}}  # fmt: skip
    if container:
        doc["container"] = {"image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    return JobSpec.model_validate(doc)


def _offer(instance_type: str) -> Offer:
    return Offer(
        instance_type=instance_type, region="us-east-1", zone="us-east-1a", market="spot",
        price_per_hour=Decimal("0.5"), on_demand_price=Decimal(1), gpu="A10G", gpus=1,
        gpu_memory_gib=24.0, vcpus=4, memory_gib=16.0,
    )  # fmt: skip


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:5000"])
def test_only_a_container_job_on_a_remote_cloud_gets_the_boot_setup(
    tmp_path: Path, endpoint: str | None
) -> None:
    provider = AwsProvider(Settings(home=tmp_path, aws=AwsSettings(endpoint_url=endpoint)))
    launcher = NodeLauncher(provider, sleep=lambda _: None)
    with_image = launch_request(_spec(True), "job-1")
    assert with_image.container and not launch_request(_spec(False), "job-1").container
    plain = LaunchRequest(job_id="j", cluster="j", count=1, gpus_per_node=1, public_key=KEY)
    gpu, cpu = _offer("g5.xlarge"), _offer("c5.xlarge")
    assert launcher._container_gpu(plain, gpu) is None
    if endpoint is None:
        assert launcher._container_gpu(with_image, gpu) is True
        assert launcher._container_gpu(with_image, cpu) is False
    else:  # the hosts of a cloud on this machine are this machine: never install on it
        assert launcher._container_gpu(with_image, gpu) is None


# --- the boot setup, run against stub package managers --------------------------------------


class Node:
    """A directory of stub commands standing for a node image: `have` commands are there,
    `packages` (name -> command) are what its package manager can install."""

    def __init__(self, root: Path, manager: str, have: tuple[str, ...], packages: dict) -> None:
        self.bin, self.calls = root / "bin", root / "calls"
        self.done = root / "done"
        self.bin.mkdir()
        for tool in ("date", "cat", "chmod"):
            os.symlink(shutil.which(tool) or tool, self.bin / tool)
        for name in ("systemctl", *have):
            self._stub(name, "exit 0")
        for package, command in packages.items():
            (root / f"provides-{package}").write_text(command)
        self._stub(manager, self._installer(root))

    def _stub(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {self.calls}\n{body}\n')
        path.chmod(0o755)

    def _installer(self, root: Path) -> str:
        return (
            '[ "$1" = install ] || exit 0\n'
            "for p; do last=$p; done\n"
            f"f={root}/provides-$last\n"
            '[ -f "$f" ] || { echo "E: Unable to locate package $last"; exit 100; }\n'
            'c=$(cat "$f")\n'
            f'printf \'#!/bin/sh\\necho "%s $*" >> {self.calls}\\n\' "$c" > {self.bin}/$c\n'
            f"chmod 755 {self.bin}/$c\n"
        )

    def boot(self, gpu: bool) -> tuple[str, list[str]]:
        script = self.bin.parent / "setup.sh"
        script.write_text(container_runtime.SETUP_TEXT)
        result = subprocess.run(
            ["/bin/sh", str(script), "1" if gpu else "0", str(self.done)],
            env={"PATH": str(self.bin)}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        calls = self.calls.read_text().splitlines() if self.calls.exists() else []
        return result.stdout + result.stderr, calls


def test_an_image_with_docker_the_toolkit_and_the_cli_installs_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, "apt-get", ("docker", "nvidia-ctk", "aws"), {})
    log, calls = node.boot(gpu=True)
    assert not [c for c in calls if c.startswith("apt-get")], calls
    assert not [c for c in calls if c.startswith("nvidia-ctk")], calls
    assert "docker: present" in log and "nvidia-ctk: present" in log and "aws: present" in log
    assert node.done.read_text().strip() == "0" and "ready" in log


def test_a_bare_ubuntu_gpu_image_gets_docker_the_toolkit_and_the_cli(tmp_path: Path) -> None:
    packages = {"docker.io": "docker", "nvidia-container-toolkit": "nvidia-ctk", "awscli": "aws"}
    node = Node(tmp_path, "apt-get", (), packages)
    log, calls = node.boot(gpu=True)
    installs = [c.split()[-1] for c in calls if c.startswith("apt-get install")]
    assert installs == ["docker.io", "nvidia-container-toolkit", "awscli"], calls
    assert [c for c in calls if c.startswith("apt-get update")] == ["apt-get update -q"]
    configure = calls.index("nvidia-ctk runtime configure --runtime=docker")
    assert calls.index("systemctl enable --now docker") < configure
    assert calls.index("systemctl restart docker") > configure
    assert node.done.read_text().strip() == "0", log


def test_a_dnf_cpu_image_gets_docker_and_no_toolkit(tmp_path: Path) -> None:
    node = Node(tmp_path, "dnf", ("aws",), {"docker": "docker", "nvidia-container-toolkit": "x"})
    log, calls = node.boot(gpu=False)
    installs = [c.split()[-1] for c in calls if c.startswith("dnf install")]
    assert installs == ["docker"], calls
    assert not [c for c in calls if "nvidia" in c] and node.done.read_text().strip() == "0"


def test_a_failed_install_is_marked_and_said_in_the_log(tmp_path: Path) -> None:
    node = Node(tmp_path, "apt-get", ("aws",), {})  # its sources have no Docker
    log, _ = node.boot(gpu=False)
    assert "E: Unable to locate package docker.io" in log
    assert "FAILED: no docker" in log and "FAILED" in log.splitlines()[-1]
    assert node.done.read_text().strip() == "1"


def test_a_pull_on_a_node_whose_docker_does_not_answer_fails_naming_the_setup_log(
    tmp_path: Path,
) -> None:
    """The pull's first step (the runtime's `prepare`) fails at once on a node without a
    working Docker (no boot setup pending), and the job's message points at the setup's log."""
    plan = PullPlan(image="team/train:1", registry=None, runtime=ec2_runtime(gpu=False),
                    auth_dir=str(tmp_path / "auth"))  # fmt: skip
    for answer, fails in (("exit 1", True), ("exit 0", False)):
        bin_dir = tmp_path / f"bin-{fails}"
        bin_dir.mkdir()
        (bin_dir / "sudo").write_text(f"#!/bin/sh\n{answer}\n")
        (bin_dir / "sudo").chmod(0o755)
        for tool in ("tail", "rm", "mkdir", "chmod"):
            os.symlink(shutil.which(tool) or tool, bin_dir / tool)
        result = subprocess.run(["/bin/sh", "-c", pull_script(plan)], env={"PATH": str(bin_dir)},
                                capture_output=True, text=True, timeout=30)  # fmt: skip
        progress = PullProgress()
        for line in result.stdout.splitlines():
            progress.feed(line)
        assert (progress.failure == "prepare-failed") == fails, result.stdout
        if fails:
            message, hint = pull_failure(plan.image, progress, "0")
            assert f"docker does not answer on this node (boot setup: {SETUP_LOG})" in message
            assert "the node needs a working Docker" in hint
