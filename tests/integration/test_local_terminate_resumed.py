"""A terminate cut short is finished by the next one: the bridge goes with the last node.

A controller killed inside `LocalProvider.terminate`, after its last node was removed but before
the bridge, leaves a bridge with nothing attached; the adopting controller terminates the same
(already gone) ids again, from their open leases, and that must remove the bridge. Namespace
nodes need root, which the tests run as.
"""

from __future__ import annotations

import secrets
import subprocess
from ipaddress import IPv4Network
from pathlib import Path

from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local import net
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def test_terminating_gone_nodes_again_removes_the_bridge_they_left(tmp_path: Path) -> None:
    tag = secrets.token_hex(3)
    settings = Settings(
        home=tmp_path / "orch",
        local=LocalSettings(
            network="namespace",
            bridge=f"orcht{tag}",
            subnet=IPv4Network(f"10.213.{100 + int(tag, 16) % 150}.0/24"),
        ),
    )
    provider = LocalProvider(settings)
    key = ensure_identity(settings.keys_dir("job"), "test").public_key
    (node,) = provider.launch(
        LaunchRequest(job_id="job", cluster="job", count=1, gpus_per_node=1, public_key=key)
    )
    try:
        # What terminate does before it reaches the bridge, and where the kill lands.
        assert provider._kill_node(node.instance_id)
        for argv in net.node_net_teardown_argvs(node.instance_id):
            subprocess.run(argv, capture_output=True, check=False)
        provider.store.remove(node.instance_id)
        assert link_exists(settings.local.bridge)

        provider.terminate([node.instance_id])
        assert not link_exists(settings.local.bridge)
    finally:
        provider.terminate([node.instance_id])
        provider.cleanup_network()
