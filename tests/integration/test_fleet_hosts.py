"""The fleet test machines (`tests.support.fleet_hosts`) are what the fleet tests take them for:
a login with its own home, the user's key authorized, GPUs from the nvidia-smi stand-in (none
on a CPU host), python3 with torch, each machine reaching the other, and `kill()` a power cut
that leaves the other machine running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.fleet_hosts import FleetMachine, fleet_machines

pytestmark = [pytest.mark.timeout(120)]


def ssh(machine: FleetMachine, command: str, known_hosts: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh", "-i", str(machine.key), "-p", str(machine.port),
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
        f"root@{machine.address}", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_machines_are_logins_with_their_own_home_gpus_and_peers(tmp_path: Path) -> None:
    with fleet_machines(tmp_path, gpus=[2, 0]) as (gpu_host, cpu_host):
        known = tmp_path / "known_hosts"
        known.write_text(gpu_host.known_hosts_line() + cpu_host.known_hosts_line())
        assert gpu_host.login == f"root@{gpu_host.address}:22"
        assert gpu_host.address != cpu_host.address and gpu_host.home != cpu_host.home

        out = ssh(
            gpu_host,
            "echo $HOME; pwd; python3 -c 'import os,pwd; print(pwd.getpwuid(0).pw_dir)'; "
            "nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits; "
            "python3 -c 'import torch; print(\"torch\", torch.__version__)'",
            known,
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[:3] == [str(gpu_host.home)] * 3  # passwd names the machine's home too
        assert lines[3:5] == ["0, NVIDIA H200, 143771", "1, NVIDIA H200, 143771"]
        assert lines[5].startswith("torch ")

        out = ssh(cpu_host, "command -v nvidia-smi || echo none; echo $HOME", known)
        assert out.stdout.splitlines() == ["none", str(cpu_host.home)]

        # one machine reaches the other (a multi-node job's rendezvous)
        peer = f"('{cpu_host.address}', 22)"
        probe = f'python3 -c "import socket; socket.create_connection({peer}, 5)"'
        assert ssh(gpu_host, probe, known).returncode == 0

        # a key not in authorized_keys does not log in
        (gpu_host.home / ".ssh" / "authorized_keys").write_text("")
        assert ssh(gpu_host, "true", known).returncode == 255

        assert gpu_host.sshd_alive() and cpu_host.sshd_alive()
        cpu_host.kill()
        assert not cpu_host.sshd_alive() and gpu_host.sshd_alive()
        assert ssh(cpu_host, "true", known).returncode == 255
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert gpu_host.name not in done and cpu_host.name not in done
