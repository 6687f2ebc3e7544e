"""A job's side of a kept cluster (`orch submit --cluster NAME`): waiting its turn, finding
the cluster's nodes, the setup digest, and noticing a cluster whose guards ended it.

One job at a time holds a cluster: `ClusterTurn` is a lock file under ORCH_HOME/clusters/
held by the job's controller for as long as it drives the job, plus the ledger's record of
which job holds it (a controller revived for the holding job takes the turn back before any
queued job). The nodes bill to the holding job while it runs and to the cluster in between
(`orchestrator.ledger.clusters`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.control.process.controllers import try_lock
from orchestrator.control.process.machine_id import machine_id
from orchestrator.errors import OrchError, SpecError
from orchestrator.ledger.clusters import UP, Clusters, autostop_left, holder
from orchestrator.ledger.store import KeptCluster, Ledger, utcnow
from orchestrator.providers.base import Instance, Provider

CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
DEFAULT_AUTOSTOP_S = 600.0


class ClusterBusy(OrchError):
    """A `--no-wait` submit found its cluster held by another job."""

    exit_code = 3


def cluster_scope(settings: Settings) -> str | None:
    """The machine whose kept clusters a name means from this ORCH_HOME, and the owner a new
    cluster records: this ORCH_HOME's machine id on a shared ledger, where names are each
    machine's own; None on a ledger of this ORCH_HOME's own (every cluster is its)."""
    return machine_id(settings.home) if settings.ledger.shared else None


def is_mine(cluster: KeptCluster, scope: str | None) -> bool:
    """Whether `cluster` is this ORCH_HOME's to end and settle, `scope` being its
    `cluster_scope` (None: a ledger of its own, where every cluster is)."""
    return scope is None or cluster.machine == scope


def check_cluster_name(name: str) -> str:
    if not CLUSTER_NAME.match(name):
        raise SpecError(
            f"--cluster {name!r} is not a cluster name",
            hint="use lower-case letters, digits and '-', starting with a letter (at most 40)",
        )
    return name


class ClusterTurn:
    """The right to run a job on one kept cluster; acquired by the job's controller."""

    def __init__(self, settings: Settings, ledger: Ledger, cluster_id: str, job_id: str) -> None:
        self.clusters = Clusters(ledger)
        self.ledger = ledger
        self.cluster_id = cluster_id
        self.job_id = job_id
        self.path = settings.home / "clusters" / f"{cluster_id}.lock"
        self._fd: int | None = None

    def try_take(self) -> bool:
        """Take the turn without waiting: the lock is free and no other live job holds the
        cluster in the ledger."""
        fd = try_lock(self.path)
        if fd is None:
            return False
        other = holder(self.ledger, self.clusters.get(self.cluster_id))
        if other not in (None, self.job_id):
            os.close(fd)  # its controller died: it is revived and takes the turn first
            return False
        self._fd = fd
        return True

    def wait(self, *, poll_s: float, on_queued: Callable[[str | None], None]) -> None:
        """Block until the turn is this job's; `on_queued` hears once whom it waits behind."""
        told = False
        while not self.try_take():
            if not told:
                on_queued(self.clusters.get(self.cluster_id).job_id)
                told = True
            time.sleep(poll_s)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def setup_digest(setup: str | None, workdir: Path) -> str | None:
    """What decides whether a kept node runs `setup` again: its text and the content of every
    workdir file it names (`pip install -r requirements.txt` names requirements.txt). None
    without a setup."""
    if not setup:
        return None
    digest = hashlib.sha256(setup.encode())
    try:
        words = shlex.split(setup, comments=True)
    except ValueError:
        words = setup.split()
    for word in sorted(set(words)):
        candidate = (workdir / word.split("=", 1)[-1]).resolve()
        if candidate.is_file() and candidate.is_relative_to(workdir.resolve()):
            digest.update(b"\0" + word.encode() + b"\0" + candidate.read_bytes())
    return digest.hexdigest()[:32]


def live_nodes(provider: Provider, cluster: KeptCluster, ledger_id: str) -> list[Instance]:
    """The cluster's nodes the provider still runs, of this ledger, by rank."""
    return sorted(
        (i for i in provider.list_owned(job_id=cluster.id) if i.ledger_id in (None, ledger_id)),
        key=lambda i: i.rank,
    )


def settle(ledger: Ledger, provider: Provider, cluster: KeptCluster) -> KeptCluster:
    """Record a cluster whose nodes are all gone (its guards' autostop, or a reclaim) as DOWN,
    its idle leases closed when the provider says they ended; returns the row as it is now.
    A cluster held by a live job is that job's controller's to handle."""
    clusters = Clusters(ledger)
    if cluster.state != UP or holder(ledger, cluster) is not None:
        return cluster
    if live_nodes(provider, cluster, ledger.ledger_id):
        return cluster
    idle_ids = sorted(
        {lease.instance_id for lease in clusters.idle_leases(cluster.id) if lease.ended_at is None}
    )
    ended = provider.self_ended(idle_ids) if idle_ids else {}
    times: list[datetime] = [end.at for end in ended.values() if end.at is not None]
    kinds = {end.kind for end in ended.values() if end.kind}
    at = max(times) if times else utcnow()
    for instance_id, end in ended.items():
        if end.at is not None:
            ledger.close_leases([instance_id], end.at)
    clusters.down(cluster.id, at, why_down(cluster, kinds, at))
    return clusters.get(cluster.id)


# How much earlier than the ledger's reckoning a node's guard may end an idle node: it counts
# from its own record of when the node went idle, and EC2 keeps the end to the second.
GUARD_EARLY_S = 30.0


def why_down(cluster: KeptCluster, kinds: set[str], at: datetime) -> str:
    """Why an idle cluster's nodes ended: their guards' word where the provider keeps it
    (local nodes), else, as on EC2, autostop when they ended once it was due."""
    if "autostop" in kinds:
        return "autostop: its guards ended the idle nodes"
    due = autostop_left(cluster, at)
    if not kinds and due is not None and due <= GUARD_EARLY_S:
        return "autostop: its idle nodes ended once it was due"
    return "its nodes are gone"


@dataclass(frozen=True)
class KeptRequest:
    """`orch submit --cluster NAME [--autostop D|never] [--no-wait]`."""

    name: str
    autostop_s: float | None = DEFAULT_AUTOSTOP_S  # None: never
    wait: bool = True  # False: refuse at once while another job runs on it


def join_cluster(
    ledger: Ledger,
    request: KeptRequest,
    *,
    provider: str,
    nodes: int,
    gpus_per_node: int,
    machine: str | None = None,
) -> KeptCluster:
    """The UP cluster `request.name` of `machine` (`cluster_scope`) a new job runs on,
    recorded first (owned by `machine`) when it has none; another machine's cluster of that
    name is never joined.

    Raises `SpecError` when the cluster is of another shape than the job (provider, nodes,
    GPUs per node), and `ClusterBusy` with `--no-wait` while another job runs on it. The
    cluster's autostop is the latest submit's."""
    clusters = Clusters(ledger)
    cluster = clusters.up(request.name, machine=machine)
    if cluster is None:
        return clusters.create(
            request.name, provider=provider, nodes=nodes, gpus_per_node=gpus_per_node,
            autostop_s=request.autostop_s, now=utcnow(), machine=machine,
        )  # fmt: skip
    theirs = (cluster.provider, cluster.nodes, cluster.gpus_per_node)
    if theirs != (provider, nodes, gpus_per_node):
        raise SpecError(
            f"cluster {request.name} is {cluster.nodes} node(s) x {cluster.gpus_per_node} GPU(s) "
            f"on {cluster.provider}; this job asks for {nodes} x {gpus_per_node} on {provider}",
            hint=f"submit with --nodes {cluster.nodes} --gpus {cluster.gpus_per_node}, use "
            f"another --cluster name, or `orch down {request.name}` first",
        )
    busy = holder(ledger, cluster)
    if busy is not None and not request.wait:
        raise ClusterBusy(
            f"cluster {request.name} runs job {busy}",
            hint="submit without --no-wait to queue behind it, or `orch cancel` that job",
        )
    if cluster.autostop_s != request.autostop_s:
        cluster = clusters.update(cluster.id, autostop_s=request.autostop_s)
    return cluster
