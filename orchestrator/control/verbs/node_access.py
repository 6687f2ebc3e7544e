"""Which node `orch ssh NAME|JOB` and `orch ssh-config NAME` reach, and with what key.

A name is a cluster of this ledger with live nodes (a job's cluster is named by its job id), or
a job id. The nodes are those the provider still runs, in rank order; their host keys are
pinned in a known_hosts file of the cluster's own (`known_hosts.shell` beside the cluster's
key), so a person's ssh never rewrites the file the controller's transfers use, and nothing is
written into `~/.ssh`. A job recorded under another cloud identity is refused, as for cancel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.connections import host_address
from orchestrator.config import Settings
from orchestrator.control.run.kept_turn import cluster_scope
from orchestrator.control.verbs.cancel import check_job_identity
from orchestrator.errors import SpecError, UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import Ledger
from orchestrator.providers import get_provider
from orchestrator.providers.base import Instance
from orchestrator.remote.keys import HostAddress, Identity, ensure_identity, write_known_hosts
from orchestrator.remote.shell import Forward, parse_forward, shell_argv, ssh_config_block

SHELL_KNOWN_HOSTS = "known_hosts.shell"


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach every live node of one cluster."""

    name: str  # the cluster's name
    job_id: str  # the job whose nodes they are
    nodes: tuple[HostAddress, ...]  # by rank
    identity: Identity  # the cluster's key
    known_hosts: Path  # pins exactly these nodes' host keys

    def node(self, rank: int) -> HostAddress:
        """Node `rank`, or SpecError naming the ranks there are."""
        if not 0 <= rank < len(self.nodes):
            raise SpecError(
                f"cluster {self.name} has no node {rank}",
                hint=f"its nodes are 0 to {len(self.nodes) - 1}",
            )
        return self.nodes[rank]

    def ssh_argv(self, rank: int, *, command: str, forwards: list[Forward]) -> list[str]:
        """The `ssh` to node `rank` (`orchestrator.remote.shell.shell_argv`): `command` is a
        command line for the node's shell ("": a shell)."""
        return shell_argv(
            self.node(rank), self.identity, self.known_hosts, command=command, forwards=forwards
        )

    def ssh_config(self) -> str:
        """One `Host orch-NAME-RANK` block per node, in rank order."""
        return "\n".join(
            ssh_config_block(f"orch-{self.name}-{rank}", node, self.identity, self.known_hosts)
            for rank, node in enumerate(self.nodes)
        )


def forwards(texts: list[str]) -> list[Forward]:
    """`-L` values as forwardings; SpecError (exit 2) for a malformed one, before any node is
    asked for."""
    return [parse_forward(text) for text in texts]


def _job_of(ledger: Ledger, name: str, machine: str | None) -> tuple[str, str, str]:
    """(job id, cluster tag, the nodes' owner id) for a kept cluster's name (among the
    clusters of `machine`: `kept.cluster_scope`), a cluster name or a job id with open leases
    in this ledger."""
    kept = Clusters(ledger).up(name, machine=machine)
    if kept is not None:
        jobs = Clusters(ledger).jobs(kept.id)
        if jobs:
            return jobs[-1].id, kept.id, kept.id
    open_leases = ledger.leases(open_only=True)
    owners = {job.id: job.node_owner for job in ledger.jobs()}
    for lease in open_leases:
        if lease.cluster == name:
            return lease.job_id, lease.cluster, owners.get(lease.job_id, lease.job_id)
    for lease in open_leases:
        if lease.job_id == name:
            return lease.job_id, lease.cluster, owners.get(lease.job_id, lease.job_id)
    try:
        ended = ledger.get_job(name)
    except UnknownJob:
        ended = None
    if ended is not None:
        raise SpecError(
            f"job {name} has no running nodes ({JobState(ended.state).value})",
            hint=f"`orch logs {name}` shows what its nodes printed; checkpoints are under "
            "ORCH_HOME/jobs/<job>/checkpoints",
        )
    raise SpecError(
        f"no running cluster or job {name!r} in this ledger",
        hint="`orch status` lists jobs and their clusters",
    )


def cluster_access(settings: Settings, ledger: Ledger, name: str) -> ClusterAccess:
    """The live nodes of cluster or job `name`, asked of its provider now (a node replaced
    after a spot interruption is the new one). Raises SpecError when nothing of that name
    runs, IdentityMismatch when the job was launched as another cloud identity."""
    scope = cluster_scope(settings)
    job_id, cluster, owner = _job_of(ledger, name, scope)
    job = ledger.get_job(job_id)
    provider = get_provider(job.provider, settings)
    check_job_identity(ledger, job_id, provider)
    live: list[Instance] = sorted(
        (
            i
            for i in provider.list_owned(job_id=owner)
            if i.cluster == cluster and i.ledger_id in (None, ledger.ledger_id)
        ),
        key=lambda i: i.rank,
    )
    if not live:
        raise SpecError(
            f"cluster {cluster} has no running node",
            hint="its nodes may be ending: `orch status` shows the job",
        )
    identity = ensure_identity(settings.keys_dir(owner), f"orch-{owner}")
    nodes = tuple(host_address(i) for i in live)
    known_hosts = identity.private_key.parent / SHELL_KNOWN_HOSTS
    write_known_hosts(known_hosts, list(nodes))
    shown = name if Clusters(ledger).up(name, machine=scope) is not None else cluster
    return ClusterAccess(shown, job_id, nodes, identity, known_hosts)
