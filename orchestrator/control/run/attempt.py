"""One attempt at running a job: the nodes of one launch, their connections and run watch.

A runner always holds an `Attempt`: a not-launched one (no node) before provisioning and
after the nodes of a run were ended, a launched one in between. Ending the nodes is the
runner's (it closes their leases); an attempt only talks to them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.run_watch import RunWatch
from orchestrator.errors import OrchError, RemoteError
from orchestrator.node import launch
from orchestrator.node.file_write import write_file_command
from orchestrator.providers.base import Instance
from orchestrator.remote.keys import Identity
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import Transfer, push_argv, run_parallel
from orchestrator.spec.model import LoadedJob

PUSH_TIMEOUT_HINT = (
    "a workdir or data path this large needs a longer controller.push_timeout "
    "(ORCH_PUSH_TIMEOUT, e.g. 2h); a push that makes no progress points at the node's network "
    "or disk (look with `orch ssh`)"
)

STOP_POLL_S = 0.2  # between two looks at a stopping run (one SSH command per node)

T = TypeVar("T")

LOST_PEER_GRACE_S = 10.0
"""How long the runs left on a job that lost a node get to exit after SIGTERM before SIGKILL."""
LOG_TAIL_BYTES = 128 * 1024
"""How much of a failed node's log is read, from its end (see `Attempt.log_tail`)."""


@dataclass(frozen=True)
class Answer:
    """A node's output of one command, and the controller's clock (ns since the epoch) just
    before it was sent and just after the answer came."""

    output: str
    sent_ns: int
    received_ns: int


class Attempt:
    """The nodes of one launch (by rank), once connected their `Cluster`, whether the run was
    started on them, its `RunWatch`, and the ranks found gone (lost, reclaimed or downed).

    Nothing here ends a node or stops its billing: that is `terminate` on the provider, which
    the runner calls before it takes a fresh attempt. The best-effort calls (`renew`,
    `stop_trainers`) leave out the gone ranks and swallow a node that does not answer; the
    others raise `RemoteError` when a node's host is gone.
    """

    def __init__(self, instances: Sequence[Instance] = (), cluster: Cluster | None = None) -> None:
        self.instances = list(instances)
        self._cluster = cluster
        self.started = False  # the run was started on these nodes (or adopted running)
        self.launch: launch.ClusterLaunch | None = None  # how it was started (None: adopted)
        self.watch: RunWatch | None = None
        self.gone_ranks: set[int] = set()
        # ranks whose nodes were up before this attempt (a kept cluster's, the survivors of a
        # partial replacement): they hold the data of an earlier sync
        self.stayed: frozenset[int] = frozenset()

    @classmethod
    def not_launched(cls) -> Attempt:
        """No node: before provisioning, or once the nodes of a run were ended."""
        return cls()

    @property
    def connected(self) -> bool:
        return self._cluster is not None

    @property
    def running(self) -> bool:
        """Connected to nodes the run was started on: there is a run to stop and collect."""
        return self._cluster is not None and self.started

    @property
    def cluster(self) -> Cluster:
        """The connections; only on an attempt opened on launched nodes."""
        if self._cluster is None:
            raise RuntimeError("this attempt has no connected node")
        return self._cluster

    @property
    def market(self) -> str | None:
        return self.instances[0].market if self.instances else None

    @property
    def zone(self) -> str | None:
        """The zone the nodes run in (all of a launch share one); None: no node, or none."""
        return self.instances[0].zone if self.instances else None

    def ids(self, ranks: Sequence[int] | None = None) -> list[str]:
        """The instance ids of `ranks` (all nodes when None)."""
        if ranks is None:
            return [i.instance_id for i in self.instances]
        return [self.instances[rank].instance_id for rank in ranks]

    def node_access(self) -> dict[str, object]:
        """What the nodes bring to the checkpoint store: credentials of their own (an instance
        profile) or none, and their region."""
        instances = self.instances if self._cluster is not None else []
        return {
            "nodes_have_credentials": bool(instances) and all(i.credentials for i in instances),
            "region": instances[0].region if instances else None,
        }

    # --- work on the nodes ----------------------------------------------------------------
    def push(
        self,
        loaded: LoadedJob,
        layout: launch.NodeLayout,
        *,
        low_priority: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Copy the workdir to every node; returns the transfers made (the `data` entries are
        `control.run.data_step`'s). A checkpoint directory inside the workdir keeps what a
        node holds in it (a node that stayed through a recovery resumes from its own files);
        the files `orch submit --fresh` left out are not sent (`loaded.left_out`).
        `low_priority`: under `nice`, giving way to more urgent work beside it. A transfer not
        done within `timeout` seconds is stopped, and `TransferTimeout` says which and what
        to do."""
        cluster = self.cluster
        checkpoints = layout.node_path(loaded.spec.checkpoint.dir)
        inside = checkpoints.removeprefix(f"{layout.workdir}/")
        protect = [inside] if inside != checkpoints else []
        transfers = [
            Transfer(
                f"workdir -> {address.name}",
                push_argv(
                    loaded.workdir,
                    address,
                    cluster.identity,
                    layout.workdir,
                    workdir=True,
                    protect=protect,
                    leave_out=loaded.left_out,
                    low_priority=low_priority,
                ),  # fmt: skip
            )
            for address in cluster.addresses
        ]
        run_parallel(transfers, timeout=timeout, timeout_hint=PUSH_TIMEOUT_HINT)
        return len(transfers)

    def free_port(self) -> int:
        """A free port on the head node, for torchrun's rendezvous."""
        said = self.cluster.head.run(launch.free_port_command()).stdout.strip()
        if not (said.isascii() and said.isdigit() and 0 < int(said) < 65536):
            raise RemoteError(
                f"node 0 named no free port for torchrun's rendezvous: {said[:80]!r}",
                hint="node 0 needs python3 (3.8 or newer) on its PATH: fix its image and "
                "submit again",
            )
        return int(said)

    def start(self, cluster_launch: launch.ClusterLaunch) -> list[str]:
        """Start the run on every node (`start_on_nodes`); from now on it counts as started."""
        pids = start_on_nodes(self.cluster, cluster_launch)
        self.started = True
        self.launch = cluster_launch
        return pids

    def read(self, command: str) -> list[str]:
        """Each node's output of `command`, by rank (its exit status ignored)."""

        def run(rank: int, connection: NodeConnection) -> str:
            return connection.run(command, timeout=15, check=False).stdout

        return self.cluster.map(run)

    def each_node(
        self, command: str, stdin: Callable[[int], str] | None = None
    ) -> dict[int, Answer]:
        """Run `command` on every node not found gone, with `stdin(rank)` as its input (best
        effort: a node that does not answer is left out); what each printed, by rank, with the
        controller's clock around it."""
        if self._cluster is None:
            return {}
        gone = set(self.gone_ranks)

        def run(rank: int, connection: NodeConnection) -> Answer | None:
            if rank in gone:
                return None
            text = stdin(rank) if stdin is not None else None
            sent = time.time_ns()
            out = connection.run(command, stdin=text, timeout=10, check=False).stdout
            return Answer(out, sent, time.time_ns())

        def tried(rank: int, connection: NodeConnection) -> Answer | None:
            with contextlib.suppress(OrchError):
                return run(rank, connection)
            return None

        answers = self._cluster.map(tried)
        return {rank: answer for rank, answer in enumerate(answers) if answer is not None}

    def stop_trainers(self, layout: launch.NodeLayout, grace_s: float) -> None:
        """SIGTERM the run on every node and wait (at most `grace_s`) for it to checkpoint and
        exit. Nodes found gone are left out (each would cost a connect timeout).

        A run that lost a node cannot finish a collective step: torchrun on the others would
        wait for its lost peer, then 30 s more for its workers, while every node bills. Those
        runs get at most `LOST_PEER_GRACE_S` (a save under way ends) and are then killed, so
        that their checkpoint agents stage what is there and the nodes can end. A node that
        merely missed a check still gets its SIGTERM and the full wait."""
        gone = set(self.gone_ranks)
        self._signal_runs(layout, "TERM", skip=gone)
        wait_s = min(grace_s, LOST_PEER_GRACE_S) if gone else grace_s
        if not self._runs_end_within(layout, wait_s, skip=gone) and gone:
            self._signal_runs(layout, "KILL", skip=gone)

    def _signal_runs(self, layout: launch.NodeLayout, signal: str, *, skip: set[int]) -> None:
        def send(rank: int, connection: NodeConnection) -> None:
            if rank not in skip:
                connection.run(launch.stop_command(layout, signal), timeout=15, check=False)

        with contextlib.suppress(OrchError):
            self.cluster.map(send)

    def _runs_end_within(self, layout: launch.NodeLayout, wait_s: float, *, skip: set[int]) -> bool:
        """Whether the run ended on every node but `skip` within `wait_s` (False when a node
        could not be asked)."""
        command = launch.probe_command(layout, None)

        def running(rank: int, connection: NodeConnection) -> bool:
            if rank in skip:
                return False
            probe = launch.parse_probe(connection.run(command, timeout=15, check=False).stdout)
            return probe.state == "running"

        deadline = time.monotonic() + wait_s
        while True:
            try:
                if not any(self.cluster.map(running)):
                    return True
            except OrchError:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(STOP_POLL_S)

    def clear_runs(self, layout: launch.NodeLayout, ranks: Sequence[int]) -> None:
        """Ready the nodes of `ranks`, which stay through a recovery, for the run's restart
        (`launch.rerun_command`: what is left of the run and its checkpoint agent killed and
        cleared, checkpoint files kept). Raises `RemoteError` when one does not answer."""
        command = launch.rerun_command(layout)
        wanted = set(ranks)

        def clear(rank: int, connection: NodeConnection) -> None:
            if rank in wanted:
                connection.run(command, timeout=30)

        self.cluster.map(clear)

    def log_tail(self, rank: int, layout: launch.NodeLayout) -> str:
        """The end of node `rank`'s log (its last 128 KiB, enough to hold the failing rank's
        traceback above torchrun's own report); empty when it cannot be read."""
        command = f"tail -c {LOG_TAIL_BYTES} {launch.home_expr(layout.log)}"
        with contextlib.suppress(OrchError):
            return self.cluster.connections[rank].run(command, timeout=15, check=False).stdout
        return ""

    def abort(self, rank: int) -> None:
        """Drop the connection to node `rank`: whatever waits on it ends now."""
        if self._cluster is not None:
            self._cluster.connections[rank].abort()

    def close(self) -> None:
        """Close the connections (the nodes keep running and billing)."""
        if self._cluster is not None:
            self._cluster.close()


AttemptOpener = Callable[[list[Instance], Identity, float], Attempt]
"""Opens an attempt on launched nodes: (instances, SSH identity, connect timeout)."""


def open_attempt(instances: list[Instance], identity: Identity, connect_timeout: float) -> Attempt:
    """An attempt connected (over SSH, as `identity`) to the nodes of one launch."""
    return Attempt(instances, Cluster(instances, identity, connect_timeout=connect_timeout))


def start_on_nodes(cluster: Cluster, cluster_launch: launch.ClusterLaunch) -> list[str]:
    """Write each node's launch script and start it detached; returns the pids, by rank.

    Refuses (RemoteError) to start a node whose run was already started.
    """
    layout = cluster_launch.layout

    def start(rank: int, connection: NodeConnection) -> str:
        instance = cluster.instances[rank]
        node = launch.NodeLaunch(
            rank, instance.interface, instance.container_runtime, instance.gpu_indices
        )
        script = launch.launch_script(cluster_launch, node)
        # 0700: the script holds the spec's env values, which may be secrets. Written and
        # started in one command: one round trip less per start.
        write = write_file_command(f"{layout.run_dir}/launch.sh", "0700")
        command = f"{write} || exit 2\n{launch.start_command(layout)}"
        return connection.run(command, stdin=script).stdout.strip()

    return cluster.map(start)
