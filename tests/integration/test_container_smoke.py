"""A real container runtime on a real local node, pulling from a real private registry.

The ground the container feature stands on, shown end to end with no orch code between:
a namespace node logs in to docker-registry (htpasswd) with wrong credentials and is refused
(the runtime's words kept: the product turns them into its message), logs in with the right
ones and pulls the test image built offline, and runs containers of it on the node's own
network: the container reaches the node's sshd at the node's address, reads the image's marker
file (not the host's OS), and runs a one-process torchrun (gloo) with the suite's torch.
Everything it started is gone afterwards and the host's cgroups, mounts and firewall are as
before.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local import net
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity
from orchestrator.remote.ssh import NodeConnection
from tests.support.containers import (
    MARKER,
    SYSTEM_STATE,
    NodePodman,
    Registry,
    auth_json,
    offline_image,
    push_image,
    running_registry,
    torch_volume,
)

pytestmark = pytest.mark.timeout(600)

# A gloo all-reduce of one rank through torchrun's rendezvous on the node's address.
GLOO = (
    "import os, torch, torch.distributed as d\n"
    "d.init_process_group('gloo')\n"
    "t = torch.ones(2)\n"
    "d.all_reduce(t)\n"
    "print('gloo', d.get_world_size(), t.tolist(), os.environ['MASTER_ADDR'], flush=True)\n"
    "d.destroy_process_group()\n"
)


@dataclass(frozen=True)
class Node:
    cluster: Cluster
    ip: str
    gateway: str  # the bridge's address: this machine, as the node reaches it


def host_state() -> dict[str, str]:
    """What podman could leave on the host: mounts, cgroup directories, files in its system
    state directory, and what a container on podman's default (bridge) network would leave:
    CNI's firewall rules, its cni-podman0 bridge, /var/lib/cni. orch's own bridge rules are
    left out of the comparison: local nodes of tests running beside this one add and remove
    theirs meanwhile."""
    cgroups = subprocess.run(
        ["find", "/sys/fs/cgroup", "-maxdepth", "3", "-type", "d", "-name", "*libpod*"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if "containers" in line or "overlay" in line]  # fmt: skip
    forward = subprocess.run(["iptables-nft", "-S"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    return {
        "cgroups": cgroups,
        "mounts": "\n".join(mounts),
        "firewall": "\n".join(r for r in forward.splitlines() if "orch-bridge:" not in r),
        "cni": f"{'cni-podman' in links} {os.path.exists('/var/lib/cni')}",
        SYSTEM_STATE: " ".join(sorted(os.listdir(SYSTEM_STATE))),  # root's podman's own
    }


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    tag = secrets.token_hex(3)
    subnet = IPv4Network(f"10.213.{20 + int(tag, 16) % 60}.0/24")
    settings = Settings(
        home=tmp_path / "orch",
        local=LocalSettings(network="namespace", bridge=f"orchc{tag}", subnet=subnet),
    )
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir("ctr"), "test")
    (instance,) = provider.launch(
        LaunchRequest(job_id="ctr", cluster="ctr", count=1, gpus_per_node=1,
                      public_key=identity.public_key)
    )  # fmt: skip
    cluster = Cluster([instance], identity, connect_timeout=5, command_timeout=300)
    try:
        yield Node(cluster, instance.private_ip, str(net.bridge_address(subnet)))
    finally:
        cluster.close()
        provider.terminate([instance.instance_id])
        provider.cleanup_network()


def test_a_node_pulls_the_private_image_and_runs_torch_in_it_on_its_own_network(
    node: Node, tmp_path: Path
) -> None:
    before = host_state()
    image = offline_image()
    (conn,) = node.cluster.connections
    podman = NodePodman("$HOME/.containers")
    with running_registry(node.gateway) as registry:
        ref = push_image(image, registry, "orch/python")
        conn.run(podman.setup(registry.address))
        try:
            check_node(conn, podman, registry, ref, image.key, node.ip)
        finally:
            conn.run(podman.teardown(), check=False)
    assert host_state() == before


def check_node(
    conn: NodeConnection, podman: NodePodman, registry: Registry, ref: str, key: str, ip: str
) -> None:
    """Refused with wrong credentials, pulls with the right ones, then three containers: the
    image's marker, the node's sshd at the node's address, a one-process torchrun (gloo)."""
    wrong = conn.run(podman.login(registry.address, registry.user), stdin="wrong\n",
                     check=False)  # fmt: skip
    assert wrong.exited != 0
    refused = wrong.stderr.strip()
    assert refused == f'Error: logging into "{registry.address}": invalid username/password'

    conn.run(podman.auth_file(), stdin=auth_json(registry.address, registry.user, "wrong"))
    pull = conn.run(f"{podman.podman()} pull --quiet {ref}", check=False)
    assert pull.exited != 0, "pulled with a wrong password"
    assert "authentication required" in pull.stderr, pull.stderr
    print(f"\nrefused login: {refused}\nrefused pull: {pull.stderr.strip()}")

    conn.run(podman.login(registry.address, registry.user), stdin=registry.password + "\n")
    started = time.monotonic()
    conn.run(f"{podman.podman()} pull --quiet {ref}")
    print(f"pull to one node: {time.monotonic() - started:.1f} s")

    started = time.monotonic()
    conn.run("true")
    bare = time.monotonic() - started
    started = time.monotonic()
    seen = conn.run(podman.run(ref, f"cat {MARKER}")).stdout.strip()
    print(f"a command: {bare:.2f} s bare, {time.monotonic() - started:.2f} s in a container")
    assert seen == key, "the container does not see the image's files"

    # the node's own sshd, at the node's own address, from inside the container
    hello = f"import socket; print(socket.create_connection(('{ip}', 22)).recv(64))"
    banner = conn.run(podman.run(ref, f'python3 -c "{hello}"')).stdout
    assert "SSH-2.0-" in banner, banner

    volume, site = torch_volume()
    torchrun = (
        f"cd /tmp && printf %s {shlex.quote(GLOO)} > gloo.py && PYTHONPATH={site} torchrun "
        f"--nnodes 1 --nproc-per-node 1 --master-addr {ip} --master-port 29511 gloo.py"
    )
    started = time.monotonic()
    gloo = conn.run(podman.run(ref, torchrun, "--volume", volume), check=False)
    print(f"torchrun in the container: {time.monotonic() - started:.1f} s")
    assert f"gloo 1 [1.0, 1.0] {ip}" in gloo.stdout, gloo.tail(40)
