"""Namespace nodes of the local provider on a bridge of their own, and the bridge's counters.

Traffic this machine sends to its nodes leaves through the bridge's own interface (its
`tx_bytes`); traffic between two nodes is switched from one node's port to another's and never
passes it. So the bridge's `tx_bytes` counts what crossed "the uplink", measured, not estimated.
A bridge and subnet per use keep other runs on this machine out of the counters.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from ipaddress import IPv4Network
from pathlib import Path

from orchestrator.cluster.connections import Cluster
from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity


def private_bridge() -> tuple[str, IPv4Network]:
    """A fresh bridge name and a /24 for it."""
    tag = secrets.token_hex(3)
    return f"orchf{tag}", IPv4Network(f"10.213.{100 + int(tag, 16) % 150}.0/24")


def tx_bytes(bridge: str) -> int:
    """Bytes this machine has sent out through `bridge` so far."""
    return int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text())


@contextmanager
def bridge_cluster(home: Path, job: str, *, count: int) -> Iterator[tuple[Cluster, str]]:
    """`count` namespace nodes on a bridge of their own, with their connections, and the
    bridge's name; the nodes and the bridge always gone afterwards."""
    bridge, subnet = private_bridge()
    settings = Settings(
        home=home, local=LocalSettings(network="namespace", bridge=bridge, subnet=subnet)
    )
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(job), "test")
    instances = provider.launch(
        LaunchRequest(job_id=job, cluster=job, count=count, gpus_per_node=1,
                      public_key=identity.public_key)
    )  # fmt: skip
    cluster = Cluster(instances, identity, connect_timeout=5)
    try:
        yield cluster, bridge
    finally:
        cluster.close()
        provider.terminate([i.instance_id for i in instances])
        provider.cleanup_network()
