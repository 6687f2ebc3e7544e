"""Putting a kept checkpoint back on every node of a cluster, from the store or the mirror.

`CheckpointKeeper.prepare` decides what a start resumes from; these carry it out:

- `restore_from_store(...)`: every node runs the agent's restore (`restore_command`) with the
  plan of `items`, downloading them from the store, all within `timeout_s` per node (else a
  `TransferTimeout`). A node whose restore fails or reports a problem is a `RemoteError`
  naming the node. On success one RESTORED event says how much went where and how long it took.
- `push_mirror(...)`: the mirror is pushed (rsync) to every node's checkpoint directory, each
  transfer stopped after `timeout_s` (`TransferTimeout`). On success one PUSHED event.

Either raises before its event when any node failed; what the nodes hold then is not to be
resumed from.
"""

from __future__ import annotations

import time

from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.connections import Cluster
from orchestrator.errors import NodeUnreachable, RemoteError, TransferTimeout
from orchestrator.ledger.store import Ledger
from orchestrator.node.checkpoint_protocol import (
    AgentLayout,
    RestoreItem,
    StoreAccess,
    restore_command,
    restore_error,
    restore_plan,
)
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import Transfer, push_argv, run_parallel


def restore_from_store(
    cluster: Cluster,
    items: list[RestoreItem],
    *,
    node_dir: str,
    access: StoreAccess,
    layout: AgentLayout,
    timeout_s: float,
    ledger: Ledger,
    job_id: str,
) -> None:
    """Every node downloads `items` from the store into `node_dir`; see the module docstring."""
    plan = restore_plan(node_dir, access, items)
    command = restore_command(layout)
    started = time.monotonic()

    def run(rank: int, connection: NodeConnection) -> None:
        try:
            result = connection.run(command, stdin=plan, timeout=timeout_s, check=False)
        except NodeUnreachable as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise
            raise TransferTimeout(
                f"node {rank}: the restore from the store did not finish within "
                f"{timeout_s:g} s ({len(items)} file(s), {_mb(items)} MB)",
                hint="the node's download from the store is too slow or hangs: look "
                "at its network with `orch ssh`",
            ) from exc
        problem = restore_error(result.stdout + result.stderr)
        if result.exited != 0 or problem is not None:
            raise RemoteError(f"node {rank}: restore from the store failed: {problem}")

    cluster.map(run)
    ledger.add_event(
        job_id, "RESTORED", f"{len(items)} file(s), {_mb(items)} MB, from the store "
        f"to {len(cluster.instances)} node(s) in {time.monotonic() - started:.1f} s",
    )  # fmt: skip


def push_mirror(
    cluster: Cluster,
    mirror: CheckpointMirror,
    *,
    node_dir: str,
    timeout_s: float,
    ledger: Ledger,
    job_id: str,
) -> None:
    """Put the mirror back in `node_dir` on every node; see the module docstring."""
    started = time.monotonic()
    run_parallel(
        [
            Transfer(
                f"checkpoints -> {address.name}",
                push_argv(mirror.root, address, cluster.identity, node_dir),
            )
            for address in cluster.addresses
        ],
        timeout=timeout_s,
        timeout_hint=f"the checkpoint mirror ({_size(mirror)}) did not reach the "
        f"node in time: a larger one needs a longer controller.push_timeout "
        "(ORCH_PUSH_TIMEOUT); one that makes no progress points at the node's network",
    )
    ledger.add_event(
        job_id, "PUSHED", f"checkpoints to {len(cluster.addresses)} node(s) in "
        f"{time.monotonic() - started:.1f} s",
    )  # fmt: skip


def _mb(items: list[RestoreItem]) -> str:
    return f"{sum(i.size for i in items) / 1e6:.1f}"


def _size(mirror: CheckpointMirror) -> str:
    return f"{sum(size for _sha, size in mirror.files().values()) / 1e6:.1f} MB"
