"""A kept cluster `dev` with one real local node, as a finished job left it: the cluster and
its job in the ledger, the node launched with the cluster's own key (`launch_kept_node`)."""

from __future__ import annotations

from orchestrator.config import Settings
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import Job, KeptCluster, Ledger, utcnow
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity


def launch_kept_node(
    settings: Settings, ledger: Ledger, name: str = "dev"
) -> tuple[KeptCluster, LocalProvider, Instance]:
    """Kept cluster `name` (UP, autostop 10 minutes) whose job `first-1` succeeded, and its one
    node, running; the caller terminates it (`provider.terminate`)."""
    cluster = Clusters(ledger).create(
        name, provider="local", nodes=1, gpus_per_node=1, autostop_s=600.0, now=utcnow()
    )
    ledger.add_job(
        Job(
            id="first-1", name="first", provider="local", nodes=1, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=utcnow(), cluster_id=cluster.id,
            state=JobState.SUCCEEDED,
        )
    )  # fmt: skip
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(cluster.id), f"orch-{cluster.id}")
    (node,) = provider.launch(
        LaunchRequest(
            job_id=cluster.id, cluster=cluster.id, count=1, gpus_per_node=1,
            public_key=identity.public_key, ledger_id=ledger.ledger_id,
        )
    )  # fmt: skip
    return cluster, provider, node
