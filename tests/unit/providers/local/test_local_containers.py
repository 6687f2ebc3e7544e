"""What local nodes need to run containers: the cgroup mounts, the prepare step, the cleanup."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.errors import ProviderError
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local import containers
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.spec.model import Budget

MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
broken line
"""


def test_each_hierarchy_is_mounted_with_its_own_options_once() -> None:
    text = containers.cgroup_mounts(MOUNTS)
    assert text.startswith("grep -q ' /sys/fs/cgroup/unified ' /proc/self/mounts || {")
    assert (
        "mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate cgroup2 /sys/fs/cgroup/unified" in text
    )
    assert (
        "mount -t cgroup -o nosuid,nodev,noexec,cpu,cpuacct cgroup /sys/fs/cgroup/cpu,cpuacct"
        in text
    )
    assert "mount -t cgroup -o nosuid,nodev,noexec,memory cgroup /sys/fs/cgroup/memory" in text
    assert containers.cgroup_mounts("proc /proc proc rw 0 0\n") == "true"


def test_prepare_says_what_to_install_when_podman_is_missing(tmp_path: Path) -> None:
    script = containers.prepare_script("", base=str(tmp_path / "base"))
    result = subprocess.run(
        ["/bin/sh", "-c", script], env={"PATH": str(tmp_path)}, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert containers.INSTALL_HINT in result.stdout
    assert not (tmp_path / "base").exists()  # nothing made before the check


def test_the_runroot_is_short_enough_for_podman() -> None:
    command = containers.podman_command()
    runroot = command.split("--runroot ", 1)[1].split()[0]
    assert len(runroot) <= 50, runroot  # podman refuses a longer one
    assert "--network" not in command  # the run's own option, never a global one


def test_empty_leftover_cgroups_go_and_busy_ones_stay(tmp_path: Path) -> None:
    done = tmp_path / "memory" / "libpod_parent" / "libpod-abc"
    (done / "conmon").mkdir(parents=True)
    busy = tmp_path / "cpu" / "libpod_parent" / "libpod-def"
    busy.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("123\n")  # stands for a cgroup that holds a process
    other = tmp_path / "memory" / "system.slice"
    other.mkdir()
    containers.remove_leftover_cgroups(tmp_path)
    assert not (tmp_path / "memory" / "libpod_parent").exists()
    assert busy.is_dir()
    assert other.is_dir()  # never anything but podman's own


def test_loopback_nodes_refuse_a_container_job_before_any_node_starts(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch", local=LocalSettings(network="loopback"))
    provider = LocalProvider(settings)
    request = LaunchRequest(
        job_id="j", cluster="j", count=1, gpus_per_node=1, public_key="ssh-ed25519 K",
        container=True,
    )  # fmt: skip
    with pytest.raises(ProviderError, match="namespace mode only") as caught:
        provider.launch(request)
    assert "without `container`" in (caught.value.hint or "")
    assert provider.list_owned() == []
    with pytest.raises(ProviderError, match="namespace mode only"):
        provider.plan(request, Budget())  # the dry run says so too
