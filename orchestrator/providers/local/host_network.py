"""The host side of local nodes' network: the mode in effect, the bridge, addresses and ports.

`HostNetwork` serves `LocalProvider`:

- `mode()`: "namespace" or "loopback", `local.network` with `auto` resolved (namespace needs
  root and iproute2's `ip`; asked for without them it is a `ProviderError`).
- `allocate(records)`: under the ORCH_HOME's allocation lock, gives each node of one launch its
  address on the bridge (namespace mode: the bridge made or brought up, its firewall rules in
  place, and each node's namespace and veth set up right after its record is saved, under the
  host-wide `HOST_LOCK`) or a free port on 127.0.0.1 (loopback mode), and saves each record.
- `free_port()`: a port on 127.0.0.1 nothing listens on and no node record claims.
- `cleanup()`: removes the bridge and its firewall rules once no node of any ORCH_HOME uses
  it; see its docstring.

A failed `ip` command is a `ProviderError` (`run_ip`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.errors import ProviderError
from orchestrator.providers.local import firewall_host, net
from orchestrator.providers.local.host import live_namespace_ips, orch_namespaces, run_checked
from orchestrator.providers.local.state import NodeRecord, NodeStore, file_lock

HOST_LOCK = Path("/run/lock/orch-local-net.lock")  # the bridge and namespaces are host-wide


class HostNetwork:
    """The network of the local nodes whose records `store` holds; see the module docstring."""

    def __init__(self, settings: Settings, store: NodeStore) -> None:
        self.settings = settings
        self.store = store

    def mode(self) -> str:
        """The network mode in effect: "namespace" or "loopback" (`auto` resolved)."""
        wanted = self.settings.local.network
        can_namespace = os.geteuid() == 0 and shutil.which("ip") is not None
        if wanted == "namespace" and not can_namespace:
            raise ProviderError(
                "local network mode 'namespace' needs root and iproute2's `ip`",
                hint="run as root, or set ORCH_LOCAL_NETWORK=loopback",
            )
        if wanted == "auto":
            return "namespace" if can_namespace else "loopback"
        return wanted

    def cleanup(self) -> bool:
        """Remove the bridge and orch's firewall rules for it if no node (of any ORCH_HOME) is
        attached to it; rules of bridges gone meanwhile go too, and a bridge still in use gets
        its rules back where the firewall lacks them (`firewall_host.sync_rules`).

        Returns True when the bridge is gone afterwards, False when nodes still use it. Does
        nothing (and returns True) when not root, as then no bridge can have been made.
        """
        if os.geteuid() != 0 or shutil.which("ip") is None:
            return True
        bridge = self.settings.local.bridge
        with file_lock(HOST_LOCK):
            ports = subprocess.run(
                net.bridge_ports_argv(bridge), capture_output=True, text=True, check=False
            )
            in_use = ports.returncode == 0 and ports.stdout.strip() not in ("", "[]")
            if ports.returncode == 0 and not in_use:
                run_ip(net.bridge_delete_argv(bridge))
                if not orch_namespaces():
                    # Only when no node of any bridge is left: removing a directory that is a
                    # mount point in another mount namespace detaches that mount there.
                    with contextlib.suppress(OSError):
                        Path(net.NODE_HOME).rmdir()
            firewall_host.sync_rules(bridge, wanted=in_use)
            return not in_use

    def allocate(self, records: list[NodeRecord]) -> None:
        """Give each node its address (and network) or port, and save its record, under lock."""
        with file_lock(self.store.root / "alloc.lock"):
            if records[0].mode == "namespace":
                with file_lock(HOST_LOCK):
                    self._allocate_namespaces(records)
            else:
                for rec in records:
                    rec.port = self.free_port()
                    self.store.save(rec)

    def free_port(self) -> int:
        """A port on 127.0.0.1 that nothing listens on and no local node record claims."""
        claimed = {rec.port for rec in self.store.all() if rec.mode == "loopback"}
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in claimed:
                return port
        raise ProviderError("found no free port on 127.0.0.1 for a local node")

    def _ensure_bridge(self) -> None:
        bridge, subnet = self.settings.local.bridge, self.settings.local.subnet
        exists = subprocess.run(
            ["ip", "link", "show", "dev", bridge], capture_output=True, check=False
        )
        if exists.returncode != 0:
            for argv in net.bridge_create_argvs(bridge, subnet):
                run_ip(argv)
        else:
            run_ip(net.bridge_addr_argv(bridge, subnet))
            run_ip(["ip", "link", "set", "dev", bridge, "up"])

    def _allocate_namespaces(self, records: list[NodeRecord]) -> None:
        subnet, bridge = self.settings.local.subnet, self.settings.local.bridge
        used = {rec.ip for rec in self.store.all() if rec.mode == "namespace"}
        used |= live_namespace_ips()
        self._ensure_bridge()
        # Docker (or any firewall) may drop forwarded traffic: accept the bridge's own.
        firewall_host.sync_rules(bridge, wanted=True, strict=True)
        for rec, ip in zip(records, net.allocate_ips(subnet, used, len(records)), strict=True):
            rec.ip = ip
            self.store.save(rec)  # the record first: terminate can then always find the node
            for argv in net.node_net_setup_argvs(rec.instance_id, ip, subnet, bridge):
                run_ip(argv)
            # The address may have belonged to a node that vanished a moment ago (a reclaim):
            # the bridge and every other node forget its link-layer address rather than wait
            # for the entry to go stale. A survivor that kept it sent its rendezvous SYNs to
            # the gone node's MAC and, through TCP's backoff, joined the new master ~30 s late.
            for argv in net.neigh_flush_argvs(ip, bridge, orch_namespaces()):
                subprocess.run(argv, capture_output=True, check=False)


def run_ip(argv: list[str]) -> str:
    """Run an `ip` command of the namespace mode; a failure is a `ProviderError`."""
    return run_checked(
        argv, hint="namespace mode needs root; ORCH_LOCAL_NETWORK=loopback avoids it"
    )
