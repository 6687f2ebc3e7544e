"""What the local provider needs on this machine (`orch check local`).

Always: Linux (local nodes are Linux processes: sessions, /proc, namespaces), OpenSSH's sshd
(one per node) and the controller's rsync and ssh. Namespace nodes (each
with its own address) also need root and iproute2's `ip`; without them `local.network: auto`
falls back to loopback nodes (sshd on 127.0.0.1), so they are needed only when
`local.network` is `namespace`. As root, the host's firewall is looked at too: traffic between
namespace nodes must get through its forward chains (Docker's FORWARD policy DROP once
br_netfilter is loaded), which orch's own rule for the bridge sees to where it can.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.providers.check import Readiness, Requirement, controller_tools, tool
from orchestrator.providers.local import firewall, firewall_host

SSHD_PATH = Path("/usr/sbin/sshd")  # where Debian's and most distributions' sshd lives


def local_readiness(
    settings: Settings, *, path: str | None = None, euid: int | None = None
) -> Readiness:
    """The local provider's requirements as found here (`path`: the PATH to search, `euid`: the
    user to judge, both this process's by default)."""
    items = [linux(), *controller_tools(path=path), _sshd(path)]
    mode = settings.local.network
    if mode != "loopback":
        needed = mode == "namespace"
        fallback = "" if needed else "; without it nodes are loopback ones, on 127.0.0.1"
        user = os.geteuid() if euid is None else euid
        items.append(
            Requirement("root", True, "running as root", needed=needed)
            if user == 0
            else Requirement(
                "root",
                False,
                f"running as uid {user}: namespace nodes need root{fallback}",
                "run orch as root (sudo -E orch ...), or set ORCH_LOCAL_NETWORK=loopback",
                needed=needed,
            )
        )
        ip = tool("ip", f"makes the nodes' namespaces{fallback}", "install iproute2", path=path)
        items.append(Requirement(ip.name, ip.ok, ip.detail, ip.fix, needed=needed))
        if user == 0 and ip.ok:  # namespace nodes: their traffic crosses the host's bridge
            items.append(bridge_traffic(settings.local.bridge, path=path))
    return Readiness("local", tuple(items))


def bridge_traffic(bridge: str, *, path: str | None = None) -> Requirement:
    """Whether traffic between namespace nodes gets through this host's firewall: Docker's
    FORWARD policy DROP with br_netfilter, or any forward chain that drops, and what orch does
    about it (`local.firewall`). Reads only: listing never creates a table."""
    found = firewall_host.read_firewall(path)
    links = firewall_host.link_names()
    verdict = firewall.forward_verdict(
        bridge,
        firewall_host.bridge_nf_call_iptables(),
        found.findings(bridge),
        in_use=bridge in links and firewall_host.bridge_in_use(bridge),
        stale=found.stale(links),
    )
    return Requirement(
        "bridge traffic", verdict.ok, verdict.detail, verdict.fix, needed=verdict.needed
    )


def linux(platform: str | None = None) -> Requirement:
    """Whether this machine (`platform`: `sys.platform` by default) can run local nodes."""
    here = sys.platform if platform is None else platform
    if here.startswith("linux"):
        return Requirement("Linux", True, f"running on {here}")
    return Requirement(
        "Linux",
        False,
        f"running on {here}: local nodes are Linux processes (their sessions, /proc, network "
        "namespaces), so the local provider runs on Linux only",
        "use --provider aws, or run orch in a Linux VM or container",
    )


def _sshd(path: str | None) -> Requirement:
    found = str(SSHD_PATH) if SSHD_PATH.exists() else shutil.which("sshd", path=path)
    if found:
        return Requirement("sshd", True, found)
    return Requirement(
        "sshd",
        False,
        f"neither {SSHD_PATH} nor on the PATH (every node is one sshd)",
        "install OpenSSH's server (apt-get install openssh-server)",
    )
