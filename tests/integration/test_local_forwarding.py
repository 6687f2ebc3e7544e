"""orch's forwarding rules against the real iptables (over nf_tables and legacy) and nft.

Each test runs in a network namespace that stands in for the host (`tests.support.netns_host`):
there it sets what Docker's daemon sets (FORWARD policy DROP, br_netfilter's
`bridge-nf-call-iptables=1`) or a plain nftables firewall that drops forwarded traffic, so the
real host's firewall and the nodes of tests running beside it are never touched. Traffic between
two nodes on the bridge is dropped until orch's rule is in place, flows with it, and the rule
goes with the bridge's last node, or with the next reconcile when a crash left it.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local import firewall_host, net
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import REPO, orch_env
from tests.support.netns_host import in_netns, kill_in_netns, nsenter_argv, private_host, sh
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120)]

SUBNET = IPv4Network("10.214.7.0/24")
PORT = 7000

# What each firewall looks like with its forward chain dropping, as Docker's daemon leaves
# iptables (its DOCKER-USER chain included), and as a plain nftables firewall does.
DROPPING = {
    "iptables-nft": [
        ["iptables-nft", "-P", "FORWARD", "DROP"],
        ["iptables-nft", "-N", "DOCKER-USER"],
        ["iptables-nft", "-A", "FORWARD", "-j", "DOCKER-USER"],
        ["iptables-nft", "-A", "DOCKER-USER", "-j", "RETURN"],
    ],
    "iptables-legacy": [["iptables-legacy", "-P", "FORWARD", "DROP"]],
    "nft": [
        ["nft", "add", "table", "inet", "fw"],
        ["nft", "add", "chain", "inet", "fw", "forward",
         "{ type filter hook forward priority 0; policy drop; }"],
        ["nft", "add", "rule", "inet", "fw", "forward", "ct", "state", "invalid", "drop"],
    ],
}  # fmt: skip
LISTING = {
    "iptables-nft": ["iptables-nft", "-S"],
    "iptables-legacy": ["iptables-legacy", "-S"],
    "nft": ["nft", "list", "ruleset"],
}


def set_dropping(host: str, backend: str) -> str:
    """Make `host`'s forward chain drop as `backend` does it; returns the listing."""
    for argv in DROPPING[backend]:
        sh(host, *argv)
    sh(host, "sh", "-c", "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables")
    return sh(host, *LISTING[backend]).stdout


def connects(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=2).close()
    except OSError:
        return False
    return True


def reaches(node: str, ip: str, port: int) -> bool:
    """Whether a TCP connection from node namespace `node` to `ip:port` is accepted."""
    probe = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=2).close()"
    out = subprocess.run(["ip", "netns", "exec", node, sys.executable, "-c", probe],
                         capture_output=True, timeout=30)  # fmt: skip
    return out.returncode == 0


@pytest.mark.parametrize("backend", ["iptables-nft", "iptables-legacy", "nft"])
def test_bridge_traffic_is_dropped_until_orch_s_rule_and_the_rule_goes_with_the_bridge(
    backend: str,
) -> None:
    bridge = "orchfw" + secrets.token_hex(2)
    ids = [net.new_instance_id() for _ in range(2)]
    ips = [str(SUBNET[2]), str(SUBNET[3])]
    with private_host() as host:
        firewall = set_dropping(host, backend)
        for argv in net.bridge_create_argvs(bridge, SUBNET):
            sh(host, *argv)
        try:
            for iid, ip in zip(ids, ips, strict=True):
                for argv in net.node_net_setup_argvs(iid, ip, SUBNET, bridge):
                    sh(host, *argv)
            listen = (f"import socket; s = socket.socket(); s.bind(('0.0.0.0', {PORT})); "
                      "s.listen(); [s.accept()[0].close() for _ in iter(int, 1)]")  # fmt: skip
            subprocess.Popen(["ip", "netns", "exec", net.netns_name(ids[0]), sys.executable,
                              "-c", listen], stdout=subprocess.DEVNULL)  # fmt: skip
            # the host reaches node 0 (not forwarded traffic) once it listens
            wait_until(lambda: in_netns(host, connects, ips[0], PORT), "node 0 listening", 20)
            node1 = net.netns_name(ids[1])
            assert not reaches(node1, ips[0], PORT), "the firewall should drop bridged traffic"

            assert in_netns(host, firewall_host.sync_rules, bridge, wanted=True, strict=True) == []
            listing = sh(host, *LISTING[backend]).stdout
            assert f"orch-bridge:{bridge}" in listing, listing
            assert reaches(node1, ips[0], PORT)
            # a second launch finds the rule in place and adds no other
            in_netns(host, firewall_host.sync_rules, bridge, wanted=True, strict=True)
            assert sh(host, *LISTING[backend]).stdout == listing

            # the bridge's last node ends: the bridge goes, and the rule with it
            for iid in ids:
                kill_in_netns(net.netns_name(iid))
                for argv in net.node_net_teardown_argvs(iid):
                    sh(host, *argv, check=False)
            settings = Settings(home=Path("/nonexistent"), local=LocalSettings(bridge=bridge))
            assert in_netns(host, LocalProvider(settings).cleanup_network)
            assert sh(host, "ip", "link", "show", "dev", bridge, check=False).returncode != 0
            assert sh(host, *LISTING[backend]).stdout == firewall
        finally:
            for iid in ids:
                kill_in_netns(net.netns_name(iid))
                subprocess.run(["ip", "netns", "del", net.netns_name(iid)], capture_output=True)


def orch_check(host: str, home: Path) -> tuple[int, dict]:
    out = subprocess.run(
        [*nsenter_argv(host), sys.executable, "-m", "orchestrator.cli", "check", "local",
         "--json"],
        env=orch_env(home), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    (local,) = json.loads(out.stdout)["providers"]
    return out.returncode, next(r for r in local["requirements"] if r["name"] == "bridge traffic")


def test_nodes_beside_docker_s_firewall_check_and_reconcile(tmp_path: Path) -> None:
    """Real namespace nodes: launched beside Docker's FORWARD DROP they reach each other;
    `orch check` says so, and says when a firewall reload took orch's rule away, which the
    next reconcile puts back; ending the nodes removes it, and a rule a crash left for a gone
    bridge goes at the next reconcile."""
    home = tmp_path / "orch"
    home.mkdir()
    bridge = "orchfw" + secrets.token_hex(2)
    (home / "config.yaml").write_text(f"local: {{network: namespace, bridge: {bridge}}}\n")
    settings = Settings(home=home, local=LocalSettings(network="namespace", bridge=bridge))
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    request = LaunchRequest(job_id="job-fw", cluster="job-fw-c0", count=2, gpus_per_node=1,
                            public_key=key.with_suffix(".pub").read_text())  # fmt: skip
    with private_host() as host:
        docker = set_dropping(host, "iptables-nft")
        code, before = orch_check(host, home)
        assert code == 0 and "policy DROP" in before["detail"], before
        assert "added when nodes start" in before["detail"]
        provider = LocalProvider(settings)
        nodes = in_netns(host, provider.launch, request)
        try:
            node1 = net.netns_name(nodes[1].instance_id)
            assert reaches(node1, nodes[0].ssh_host, 22)
            code, running = orch_check(host, home)
            assert code == 0 and "in place now" in running["detail"], running

            # a firewall reload (Docker restarted, `iptables-restore`) drops orch's rule
            rule = ["-i", bridge, "-o", bridge, "-m", "comment", "--comment",
                    f"orch-bridge:{bridge}", "-j", "ACCEPT"]  # fmt: skip
            sh(host, "iptables-nft", "-D", "DOCKER-USER", *rule)
            assert not reaches(node1, nodes[0].ssh_host, 22)
            code, cut = orch_check(host, home)
            assert code == 1 and "cannot reach each other" in cut["detail"], cut
            assert "orch reconcile" in cut["fix"]
            in_netns(host, provider.list_owned)  # what `orch reconcile` lists first
            assert reaches(node1, nodes[0].ssh_host, 22)
        finally:
            in_netns(host, provider.terminate, [node.instance_id for node in nodes])
        assert sh(host, "iptables-nft", "-S").stdout == docker

        # a crash between removing a bridge and its rule leaves the rule: reconcile removes it
        sh(host, "iptables-nft", "-I", "DOCKER-USER", "-i", "gone0", "-o", "gone0", "-m",
           "comment", "--comment", "orch-bridge:gone0", "-j", "ACCEPT")  # fmt: skip
        left = orch_check(host, home)[1]["detail"]
        assert "gone bridges remain (iptables-nft DOCKER-USER for gone0)" in left, left
        in_netns(host, provider.list_owned)
        assert sh(host, "iptables-nft", "-S").stdout == docker
