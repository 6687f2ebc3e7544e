"""The runner's part for a job on a kept cluster: take the cluster's turn, run on the nodes it
already has (nothing launched, only what changed synced, `setup` only when it changed), and
at the end let the nodes go still running, their bill moved to the cluster.

Billing: the job's leases on reused nodes open when it takes them and close when it lets them
go, at the same instants as the cluster's idle leases close and open (`Clusters.hold` and
`release`). A cluster whose nodes cannot all be kept (one was lost, the ledger says another
job holds it) ends them, and is DOWN from then on.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import datetime

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.steps import node_step
from orchestrator.config import Settings
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.current_attempt import CurrentAttempt
from orchestrator.control.run.ending import NodeEnder
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.kept_turn import ClusterTurn, live_nodes, settle, setup_digest
from orchestrator.control.run.launcher import Launcher
from orchestrator.control.run.options import Reporter
from orchestrator.errors import OrchError
from orchestrator.ledger.clusters import UP, Clusters
from orchestrator.ledger.store import KeptCluster, Lease, utcnow
from orchestrator.node.clear_protocol import Cleared, parse_cleared, reset_command
from orchestrator.node.launch import NodeLayout
from orchestrator.providers.base import Instance, Provider
from orchestrator.spec.model import LoadedJob

QUEUE_POLL_S = 1.0


class KeptNodes:
    """What a job's runner does with its kept cluster (the job's `cluster_id`)."""

    def __init__(
        self,
        *,
        journal: Journal,
        loaded: LoadedJob,
        layout: NodeLayout,
        settings: Settings,
        provider: Provider,
        reporter: Reporter,
        guards: Guards,
        launcher: Launcher,
        current: CurrentAttempt,
        nodes: NodeEnder,
    ) -> None:
        job = journal.job
        assert job.cluster_id is not None
        self.journal = journal
        self.ledger = journal.ledger
        self.spec = loaded.spec
        self.layout = layout
        self.provider = provider
        self.reporter = reporter
        self.guards = guards
        self.launcher = launcher
        self.current = current
        self.nodes = nodes
        self.clusters = Clusters(self.ledger)
        self.cluster_id = job.cluster_id
        self.turn = ClusterTurn(settings, self.ledger, job.cluster_id, job.id)
        self.held = False  # this job holds the cluster's nodes (their bill is the job's)
        guards.autostop_s = self.row.autostop_s
        launcher.setup_key = setup_digest(self.spec.setup, loaded.workdir)

    @property
    def row(self) -> KeptCluster:
        return self.clusters.get(self.cluster_id)

    def take_turn(self) -> None:
        """Wait (the job PENDING, a QUEUED event) until no other job runs on the cluster."""

        def queued(behind: str | None) -> None:
            whom = f"job {behind}" if behind else "another job"
            self.journal.event("QUEUED", f"cluster {self.row.name} runs {whom}; waiting")
            self.reporter.phase(f"queued: cluster {self.row.name} runs {whom}")

        self.turn.wait(poll_s=QUEUE_POLL_S, on_queued=queued)
        self.held = self.row.job_id == self.journal.job.id  # a revived controller's own

    def reuse(self) -> bool:
        """Run on the cluster's live nodes (held in `current` from the moment they are the
        job's); False (nothing done) when the cluster has none, or not the job's count (those
        few are ended first, so a fresh launch replaces them)."""
        cluster = settle(self.ledger, self.provider, self.row)
        if cluster.state != UP:
            return False
        live = live_nodes(self.provider, cluster, self.ledger.ledger_id)
        if len(live) != self.spec.resources.nodes:
            if live:
                self.journal.event(
                    "WARNING", f"cluster {cluster.name} has {len(live)} of "
                    f"{self.spec.resources.nodes} node(s) up; they end and new ones launch",
                )  # fmt: skip
                self.nodes.terminate_all(live)
            return False
        now = utcnow()
        self.journal.provisioning(
            f"kept cluster {cluster.name}: {len(live)} node(s) up, nothing launched"
        )
        self.clusters.hold(cluster.id, self.journal.job.id, now)
        self.held = True
        self.current.hold(Attempt(live))
        job = self.journal.job
        for instance in live:
            self.ledger.open_lease(
                Lease.from_instance(
                    replace(instance, launched_at=now),
                    job_id=job.id,
                    provider=self.provider.name,
                    identity=job.identity,
                )  # fmt: skip
            )
        self.journal.event(
            "REUSED", f"cluster {cluster.name}: node(s) "
            f"{', '.join(i.instance_id for i in live)}, billed to this job from now",
        )  # fmt: skip
        attempt = self.launcher.reopen(live)
        self.current.hold(attempt)
        self._reset(attempt, cluster.name)
        return True

    def _reset(self, attempt: Attempt, name: str) -> None:
        """Clear what the nodes hold of the last job (`reset_nodes`); a RESET event says what
        was removed, or left where it lies outside the job's folder."""
        where = self.spec.checkpoint.dir
        answers = reset_nodes(
            attempt.cluster, self.layout, self.layout.node_path(where), cluster_name=name
        )
        removed = sum(answer.removed for answer in answers)
        if removed:
            self.journal.event(
                "RESET", f"removed the last job's {removed} checkpoint file(s) from "
                f"checkpoint.dir {where} on the nodes: this run starts without them",
            )  # fmt: skip
        if any(answer.dir == "outside" for answer in answers):
            self.journal.event(
                "RESET", f"checkpoint.dir {where} lies outside the job's folder on the nodes: "
                "what earlier jobs left there stays, and this run may resume from it",
            )  # fmt: skip

    def launched(self) -> None:
        """New nodes were launched for the cluster (its first job, or nodes replaced)."""
        cluster = self.row
        if cluster.state != UP:
            self.clusters.update(cluster.id, state=UP, ended_at=None, reason=None)
        self.clusters.hold(cluster.id, self.journal.job.id, utcnow())
        self.held = True

    def adopted(self) -> None:
        """A revived controller took over the job's run on the cluster."""
        self.held = self.row.job_id == self.journal.job.id

    def may_keep(self, attempt: Attempt) -> bool:
        """Whether every node of the job's run still runs, so the cluster can stay up."""
        ids = set(attempt.ids())
        if not attempt.connected or len(ids) != self.spec.resources.nodes:
            return False
        try:
            live = live_nodes(self.provider, self.row, self.ledger.ledger_id)
        except OrchError:
            return False
        return ids <= {i.instance_id for i in live}

    def release(self, attempt: Attempt) -> datetime:
        """Let the nodes go, still running: their guards lose the job's limits (autostop
        counts from now), the job's leases close, the cluster's idle leases open."""
        with contextlib.suppress(OrchError):
            self.guards.clear(attempt)
        now = utcnow()
        instances: list[Instance] = list(attempt.instances)
        self.ledger.close_leases([i.instance_id for i in instances], now)
        self.clusters.release(
            self.cluster_id, [(i.instance_id, i.rank, i.price_per_hour) for i in instances], now
        )
        self.held = False
        cluster = self.row
        autostop = (
            f"autostop after {cluster.autostop_s:.0f} s idle"
            if cluster.autostop_s is not None
            else "no autostop: `orch down` ends it"
        )
        self.journal.event(
            "KEPT", f"cluster {cluster.name}: {len(instances)} node(s) stay up for the next "
            f"job, billed to the cluster; {autostop}",
        )  # fmt: skip
        return now

    def ended(self, at: datetime, reason: str) -> None:
        """The job's nodes were ended: the cluster is DOWN unless nodes of it still run."""
        with contextlib.suppress(OrchError):
            if live_nodes(self.provider, self.row, self.ledger.ledger_id):
                return
        self.clusters.down(self.cluster_id, at, reason)
        self.held = False


def reset_nodes(
    cluster: Cluster, layout: NodeLayout, checkpoint_dir: str, *, cluster_name: str
) -> list[Cleared]:
    """Clear, on every node of a kept cluster, what it holds of its last job before the next
    starts (`clear_protocol.reset_command`: the run, the agent's state, and the last job's
    checkpoints where they lie in the job's own folder; never the workdir or anything outside).
    Each node's answer, by rank. A node that fails raises a `RemoteError` that names the step
    and what to do."""
    command = reset_command(layout, checkpoint_dir)
    with node_step(
        f"reset of kept cluster {cluster_name}'s nodes for this job",
        hint=f"the nodes may still hold the last job's files: end the cluster with `orch down "
        f"{cluster_name}` and submit again (new nodes start clean), or look with `orch ssh "
        f"{cluster_name}`",
    ):
        return cluster.map(
            lambda rank, connection: parse_cleared(connection.run(command, timeout=120).stdout)
        )
