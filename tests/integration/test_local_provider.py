"""The local provider against real sshd's, namespaces and the OpenSSH client.

Each test gets its own ORCH_HOME, and in namespace mode its own bridge and subnet, so tests (and
other runs on the same machine that use the default bridge) never share network state. All
traffic stays on 127.0.0.1 or inside namespaces these tests create.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import paramiko
import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.errors import ProviderError
from orchestrator.providers.base import Instance, LaunchRequest, Provider
from orchestrator.providers.local import net as local_net
from orchestrator.providers.local.host import pid_runs, pids_with_marker
from orchestrator.providers.local.provider import LocalProvider
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120)]

MODES = [
    pytest.param(
        "namespace",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="namespace mode needs root"),
    ),
    "loopback",
]


@pytest.fixture(scope="module")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The controller's key pair; returns the private key file (public key next to it)."""
    key = tmp_path_factory.mktemp("client") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def make_settings(home: Path, mode: str, price: str = "0") -> Settings:
    """Settings with a private ORCH_HOME and, per test, a bridge and subnet of its own."""
    tag = secrets.token_hex(3)
    return Settings(
        home=home,
        local=LocalSettings(
            network=mode,
            price_per_hour=Decimal(price),
            bridge=f"orcht{tag}",
            subnet=IPv4Network(f"10.213.{100 + int(tag, 16) % 150}.0/24"),
        ),
    )


@pytest.fixture
def providers() -> Iterator[list[LocalProvider]]:
    """Collects the providers a test makes and ends whatever they still run afterwards."""
    made: list[LocalProvider] = []
    yield made
    for provider in made:
        provider.terminate([inst.instance_id for inst in provider.list_owned()])
        provider.cleanup_network()


def request(key: Path, job: str = "job-1", count: int = 2, spot: bool = True) -> LaunchRequest:
    return LaunchRequest(
        job_id=job,
        cluster=f"{job}-c0",
        count=count,
        gpus_per_node=2,
        public_key=key.with_suffix(".pub").read_text(),
        spot=spot,
    )


def known_hosts(tmp: Path, inst: Instance, host_key: str | None = None) -> Path:
    """A known_hosts file pinning `host_key` (default: the one the provider reported)."""
    host = inst.ssh_host if inst.ssh_port == 22 else f"[{inst.ssh_host}]:{inst.ssh_port}"
    path = tmp / f"known_hosts-{inst.instance_id}-{secrets.token_hex(2)}"
    path.write_text(f"{host} {host_key or inst.host_key}\n")
    return path


def ssh_argv(
    inst: Instance, key: Path, tmp: Path, command: str, host_key: str | None = None
) -> list[str]:
    """The OpenSSH client running `command` on a node, host key pinned, no prompts."""
    return [
        "ssh", "-i", str(key), "-p", str(inst.ssh_port),
        "-o", f"UserKnownHostsFile={known_hosts(tmp, inst, host_key)}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
        f"{inst.ssh_user}@{inst.ssh_host}", command,
    ]  # fmt: skip


def ssh(
    inst: Instance, key: Path, tmp: Path, command: str, host_key: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `command` on a node over SSH and wait for it."""
    argv = ssh_argv(inst, key, tmp, command, host_key)
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; return its last value."""
    try:
        return wait_until(condition, "the condition", timeout, interval=0.05)
    except AssertionError:
        return False


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def assert_node_gone(provider: LocalProvider, instance_id: str) -> None:
    """Nothing of the node is left: no process, no sshd, no namespace or veth, no files."""
    node_dir = provider.settings.home / "local" / "nodes" / instance_id
    assert pids_with_marker(instance_id) == set()
    sshd_config = str(node_dir / "sshd_config")
    assert not [p for p in os.listdir("/proc") if p.isdigit() and pid_runs(int(p), sshd_config)]
    assert not node_dir.exists()
    if os.geteuid() == 0:
        assert local_net.netns_name(instance_id) not in namespaces()
        assert not link_exists(local_net.host_veth_name(instance_id))


@pytest.mark.parametrize("mode", MODES)
def test_two_nodes_from_launch_to_terminate(
    mode: str, tmp_path: Path, client_key: Path, providers: list[LocalProvider]
) -> None:
    settings = make_settings(tmp_path / "orch", mode, price="0.75")
    provider = LocalProvider(settings)
    providers.append(provider)
    assert isinstance(provider, Provider)

    before = datetime.now(UTC)
    nodes = provider.launch(request(client_key))
    after = datetime.now(UTC)

    # What the provider reports.
    assert [n.rank for n in nodes] == [0, 1]
    assert len({n.instance_id for n in nodes}) == 2
    for node in nodes:
        assert node.price_per_hour == Decimal("0.250000")  # spot: a third of on-demand
        assert node.market == "spot" and node.instance_type == "local-2x"
        assert before <= node.launched_at <= after and node.launched_at.tzinfo is not None
        assert node.host_key.startswith("ssh-ed25519 AAAA") and len(node.host_key.split()) == 2
        assert node.tags["orch:job"] == "job-1" and node.tags["orch:rank"] == str(node.rank)
        assert node.ssh_host == node.private_ip
    if mode == "namespace":
        assert all(IPv4Address(n.private_ip) in settings.local.subnet for n in nodes)
        assert nodes[0].private_ip != nodes[1].private_ip
        assert {n.ssh_port for n in nodes} == {22} and {n.interface for n in nodes} == {"eth0"}
        expected_homes = [local_net.NODE_HOME] * 2
    else:
        assert {n.private_ip for n in nodes} == {"127.0.0.1"} and nodes[0].interface == "lo"
        assert nodes[0].ssh_port != nodes[1].ssh_port
        nodes_dir = settings.home / "local" / "nodes"
        expected_homes = [str(nodes_dir / n.instance_id / "disk") for n in nodes]
    assert provider.list_owned() == nodes
    assert provider.list_owned(job_id="job-1") == nodes
    assert provider.list_owned(job_id="other") == []

    # Every session starts in the node's HOME, with the shared venv first after <home>/bin.
    for node, home in zip(nodes, expected_homes, strict=True):
        out = ok(
            ssh(
                node,
                client_key,
                tmp_path,
                'echo "$HOME"; pwd; echo "$ORCH_LOCAL_NODE"; '
                'python -c "import sys; print(sys.prefix)"',
            )
        )
        assert out.splitlines() == [home, home, node.instance_id, sys.prefix]

    # HOME is private: what node 0 writes is on node 0's disk only.
    ok(ssh(nodes[0], client_key, tmp_path, "echo rank0 > ~/only-on-0 && mkdir -p ~/ckpt"))
    disk0 = settings.home / "local" / "nodes" / nodes[0].instance_id / "disk"
    assert (disk0 / "only-on-0").read_text() == "rank0\n"
    assert ok(ssh(nodes[1], client_key, tmp_path, "ls -A ~")) == ""
    if mode == "namespace":  # the mount is private to the node: the host sees none of it
        assert not Path(local_net.NODE_HOME, "only-on-0").exists()

    # Node 1 reaches node 0 at its private address (the torchrun master address).
    target = f"('{nodes[0].private_ip}', {nodes[0].ssh_port})"
    probe = (
        f'python -c "import socket; print(socket.create_connection({target}, 5).recv(4).decode())"'
    )
    assert ok(ssh(nodes[1], client_key, tmp_path, probe)) == "SSH-"

    # Name lookups never stall: the node's own name resolves, an unknown address fails at once
    # (torch's c10d reverse-resolves every peer; a DNS timeout would cost seconds each).
    lookup = (
        'python -c "import socket, time; t = time.monotonic(); '
        "print(socket.gethostbyname(socket.gethostname()) != '');\n"
        "try: socket.gethostbyaddr('10.213.255.254')\n"
        'except OSError: pass\nprint(round(time.monotonic() - t, 1) < 2)"'
    )
    assert ok(ssh(nodes[1], client_key, tmp_path, lookup)).split() == ["True", "True"]

    # Each node names its own address and its peers', as glibc's getent and Python see them and
    # as torch's c10d looks up a socket's peer: getnameinfo of the address as a dual-stack
    # listener sees it (::ffff:<IPv4>), no error (c10d warns "The hostname of the client socket
    # cannot be retrieved" on one).
    ips = " ".join(n.private_ip for n in nodes)
    names = (
        'python -c "import socket, sys\n'
        "print(socket.gethostname())\n"
        "for ip in sys.argv[1:]:\n"
        "    mapped = ('::ffff:' + ip, 0, 0, 0)\n"
        "    print(socket.gethostbyaddr(ip)[0], "
        'socket.getnameinfo(mapped, socket.NI_NUMERICSERV)[0])" ' + ips
    )
    for node in nodes:
        out = ok(ssh(node, client_key, tmp_path, f"getent hosts {ips} && echo -- && {names}"))
        getent, seen = (part.strip().splitlines() for part in out.split("--\n"))
        if mode == "namespace":  # each its own hostname, EC2's way, the same on every node
            wanted = [local_net.node_hostname(n.private_ip) for n in nodes]
            assert [line.split() for line in getent] == [
                [n.private_ip, name] for n, name in zip(nodes, wanted, strict=True)
            ]
            assert seen == [wanted[node.rank], *(f"{name} {name}" for name in wanted)]
        else:  # 127.0.0.1: named by this machine's own /etc/hosts
            assert getent and all(len(line.split()) > 1 for line in getent), getent
            assert all(len(line.split()) == 2 for line in seen[1:]), seen

    # SFTP (paramiko) works too, and lands in HOME.
    client = paramiko.SSHClient()
    host = (
        nodes[0].ssh_host
        if nodes[0].ssh_port == 22
        else f"[{nodes[0].ssh_host}]:{nodes[0].ssh_port}"
    )
    kind, blob = nodes[0].host_key.split()
    client.get_host_keys().add(
        host, kind, paramiko.PKey.from_type_string(kind, base64.b64decode(blob))
    )
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        nodes[0].ssh_host,
        port=nodes[0].ssh_port,
        username=nodes[0].ssh_user,
        key_filename=str(client_key),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
    )
    with client.open_sftp() as sftp:
        assert "only-on-0" in sftp.listdir(".")
    idle = client.get_transport()  # stays connected, idle, until the node is terminated
    assert idle is not None and idle.is_active()

    # A different host key is refused.
    refused = ssh(nodes[0], client_key, tmp_path, "true", host_key=nodes[1].host_key)
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr

    # Detached work that escaped the sshd session is found by the node marker.
    for node in nodes:
        ok(ssh(node, client_key, tmp_path,
               "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo started"))  # fmt: skip
        assert wait_for(
            lambda n=node: any(pid_runs(p, "sleep 1000") for p in pids_with_marker(n.instance_id))
        )
    # A session still connected when the node goes: its server side must go too.
    attached = subprocess.Popen(
        ssh_argv(nodes[1], client_key, tmp_path, "echo up; sleep 1000"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert attached.stdout is not None and attached.stdout.readline() == "up\n"

    stopped = provider.terminate([n.instance_id for n in nodes])
    assert attached.wait(timeout=10) == 255  # connection closed by the node's end
    assert wait_for(lambda: not idle.is_active())  # the idle connection's sshd ended too
    client.close()
    attached.stdout.close()
    assert stopped.tzinfo is not None and stopped >= max(n.launched_at for n in nodes)
    for node in nodes:
        assert_node_gone(provider, node.instance_id)
    assert provider.list_owned() == []
    if mode == "namespace":
        assert not link_exists(settings.local.bridge)  # no node left on it

    again = provider.terminate([n.instance_id for n in nodes])  # idempotent
    assert again >= stopped
    assert provider.list_owned() == []


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_launches_get_distinct_addresses(
    mode: str, tmp_path: Path, client_key: Path, providers: list[LocalProvider]
) -> None:
    shared = make_settings(tmp_path / "home-a", mode)
    other_home = shared.model_copy(update={"home": tmp_path / "home-b"})
    made = [LocalProvider(shared), LocalProvider(shared), LocalProvider(other_home)]
    providers.extend(made)
    results: dict[int, list[Instance]] = {}
    errors: list[BaseException] = []

    def launch(i: int) -> None:
        try:
            results[i] = made[i].launch(request(client_key, job=f"job-{i}", spot=False))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(len(made))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors

    nodes = [node for i in sorted(results) for node in results[i]]
    assert len(nodes) == 6
    addresses = {(n.private_ip, n.ssh_port) for n in nodes}
    assert len(addresses) == 6
    if mode == "namespace":
        assert len({n.private_ip for n in nodes}) == 6
    assert {n.market for n in nodes} == {"on-demand"}
    assert [n.job_id for n in made[0].list_owned(job_id="job-1")] == ["job-1", "job-1"]
    assert len(made[0].list_owned()) == 4 and len(made[2].list_owned()) == 2

    for i, provider in enumerate(made):
        provider.terminate([n.instance_id for n in results[i]])
    for i, provider in enumerate(made):
        for node in results[i]:
            assert_node_gone(provider, node.instance_id)


@pytest.mark.parametrize("mode", MODES)
def test_a_node_that_fails_to_start_takes_the_others_down(
    mode: str,
    tmp_path: Path,
    client_key: Path,
    providers: list[LocalProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = LocalProvider(make_settings(tmp_path / "orch", mode))
    providers.append(provider)
    real = local_net.sshd_config_text
    started: list[str] = []

    def broken_second_node(cfg: local_net.SshdConfig) -> str:
        started.append(cfg.env[local_net.NODE_MARKER])
        return real(cfg) + ("NoSuchOption yes\n" if len(started) == 2 else "")

    monkeypatch.setattr(local_net, "sshd_config_text", broken_second_node)
    with pytest.raises(ProviderError, match="NoSuchOption"):
        provider.launch(request(client_key, count=3))
    assert len(started) == 3
    assert provider.list_owned() == []
    for instance_id in started:
        assert_node_gone(provider, instance_id)
    if mode == "namespace":
        assert not link_exists(provider.settings.local.bridge)


LAUNCH_AND_EXIT = """
import json, sys
from pathlib import Path
from orchestrator.config import Settings
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.provider import LocalProvider

settings = Settings.model_validate_json(sys.argv[1])
key = Path(sys.argv[2]).read_text()
nodes = LocalProvider(settings).launch(LaunchRequest("job-9", "job-9-c0", 2, 1, key))
print(json.dumps([n.instance_id for n in nodes]))
"""


@pytest.mark.parametrize("mode", MODES)
def test_nodes_outlive_their_launcher_and_a_fresh_provider_ends_them(
    mode: str, tmp_path: Path, client_key: Path, providers: list[LocalProvider]
) -> None:
    settings = make_settings(tmp_path / "orch", mode)
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCH_AND_EXIT, settings.model_dump_json(),
         str(client_key.with_suffix(".pub"))],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    provider = LocalProvider(settings)
    providers.append(provider)
    assert launcher.returncode == 0, launcher.stderr
    ids = json.loads(launcher.stdout)

    owned = provider.list_owned(job_id="job-9")
    assert [n.instance_id for n in owned] == ids
    assert ok(ssh(owned[1], client_key, tmp_path, "echo alive")) == "alive"

    provider.terminate(ids)
    for instance_id in ids:
        assert_node_gone(provider, instance_id)
    assert provider.list_owned() == []


def test_nodes_carry_their_ledger_and_unknown_ids_are_not_taken_for_ended(
    tmp_path: Path, client_key: Path, providers: list[LocalProvider]
) -> None:
    from dataclasses import replace

    from orchestrator.errors import InstancesNotFound
    from orchestrator.providers.base import CloudIdentity

    provider = LocalProvider(make_settings(tmp_path / "a", "loopback"))
    other = LocalProvider(make_settings(tmp_path / "b", "loopback"))
    providers.extend([provider, other])
    (node,) = provider.launch(replace(request(client_key, count=1), ledger_id="aaaa"))
    assert node.ledger_id == "aaaa" and node.tags["orch:ledger"] == "aaaa"
    assert [n.ledger_id for n in provider.list_owned()] == ["aaaa"]
    assert provider.identity() == CloudIdentity("local", f"{os.uname().nodename}:{tmp_path / 'a'}")
    assert other.identity() != provider.identity()

    # another ORCH_HOME cannot see the node: it says so instead of calling it ended
    with pytest.raises(InstancesNotFound) as raised:
        other.terminate([node.instance_id])
    assert raised.value.instance_ids == (node.instance_id,)
    assert [n.instance_id for n in provider.list_owned()] == [node.instance_id]

    with pytest.raises(InstancesNotFound) as raised:
        provider.terminate([node.instance_id, "l-00000dead0"])
    assert raised.value.instance_ids == ("l-00000dead0",)
    assert_node_gone(provider, node.instance_id)  # the known one was ended
    provider.terminate([node.instance_id])  # ended here before: idempotent
