"""Bucket data onto the nodes and outputs off them, through the node program `bucket-data`.

Every node moves its own bytes, straight between the bucket and itself, with its own
credentials (an instance role) or the ones this machine hands over where the provider has none
to give (`StoreAccess`); nothing passes through this machine. All nodes work at once, each one
SSH command per entry, its input (credentials included) on stdin, never in an argument. While
they work, `progress` hears at most once a second the bytes moved and to move over all nodes.

A node's output is data (`orchestrator.node.bucket_lines`): counts bounded, messages cut. A
failed node raises `DataError` naming the source and the node, once every node finished.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.node_runtime import ensure_runtime
from orchestrator.errors import DataError, OrchError
from orchestrator.node import runtime
from orchestrator.node.bucket_lines import BucketLines
from orchestrator.node.checkpoint_protocol import StoreAccess
from orchestrator.node.node_kit import dumps
from orchestrator.remote.ssh import NodeConnection

MAX_LINE = 8192
QUIET_S = 300.0  # a node that prints nothing for this long (it prints each second) is stuck
REPORT_EVERY_S = 1.0

_HINTS = {
    "missing": "check the bucket and prefix in the spec (`aws s3 ls URL`), then submit again",
    "denied": "give the nodes read access to it (their instance role on AWS; on local nodes the "
    "credentials orch runs with), then submit again",
    "disk": "give the nodes a larger disk (resources.disk_gb) or fetch less, then submit again",
    "boto3": "use a node image with boto3 for python3 (`pip install boto3`), then submit again",
    "key": "the bucket holds a name that cannot be a file on a node: rename or leave it out",
    "other": "the lines above say what failed; fix it and submit again",
}


@dataclass(frozen=True)
class BucketWork:
    """One run of `bucket-data` on one node: `fetch` (a data source) or `upload` (an output)."""

    label: str  # how messages name it: "data[0] s3://b/p -> ~/ds"
    verb: str  # "fetch" | "upload"
    document: Mapping[str, object]  # the program's input, without the access fields

    def stdin(self, access: StoreAccess) -> str:
        """The program's input: the work's fields and how to reach the bucket."""
        access_fields = access.document()
        access_fields.pop("url", None)
        return dumps({**self.document, **access_fields}) + "\n"


@dataclass(frozen=True)
class Tick:
    """Where a phase stands: bytes moved and to move over all nodes, since `seconds`."""

    stage: str
    done: int
    total: int
    seconds: float

    @property
    def rate(self) -> float:
        """Bytes a second so far."""
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def left_s(self) -> float | None:
        """Seconds left at the rate so far; None before anything moved."""
        if self.rate <= 0 or self.total < self.done:
            return None
        return (self.total - self.done) / self.rate

    def describe(self) -> str:
        """`bucket data: 1.2 of 2.0 GiB, 85.3 MiB/s, 10 s left`."""
        left = self.left_s
        tail = f", {left:.0f} s left" if left is not None and self.done < self.total else ""
        return (
            f"{self.stage}: {human_bytes(self.done)} of {human_bytes(self.total)}, "
            f"{human_bytes(self.rate)}/s{tail}"
        )


def human_bytes(size: float) -> str:
    """`size` in B, KiB, MiB or GiB with one decimal."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"


def run_bucket_work(
    cluster: Cluster,
    work: Mapping[int, Sequence[BucketWork]],
    access: Callable[[BucketWork], StoreAccess],
    *,
    stage: str,
    progress: Callable[[Tick], None] | None = None,
    timeout_s: float | None = None,
) -> dict[int, list[BucketLines]]:
    """Run each node's `work` (by rank; its entries one after the other, the nodes at once)
    and return what each run said, by rank, in order. Raises `DataError` for the first node
    whose run failed, after the others finished (so none is left half done), or a
    `RemoteError` for a node that stopped answering. `timeout_s` bounds the whole phase.

    `progress` may raise an `OrchError` (a budget reached, a phase that stopped moving): every
    node then stops reading its run, and that error is raised once all returned."""
    started = time.monotonic()
    said: dict[int, list[BucketLines]] = {rank: [] for rank in work}
    lock = threading.Lock()
    last = [0.0]
    halt: list[OrchError] = []

    def tick(force: bool = False) -> None:
        if progress is None or halt:
            return
        with lock:
            now = time.monotonic()
            if not force and now - last[0] < REPORT_EVERY_S:
                return
            last[0] = now
            runs = [run for runs in said.values() for run in runs]
            done = sum(run.bytes_done for run in runs)
            total = sum(run.total for run in runs)
        try:
            progress(Tick(stage, done, total, now - started))
        except OrchError as exc:
            halt.append(exc)

    def node(rank: int, connection: NodeConnection) -> None:
        entries = work.get(rank, ())
        if not entries:
            return
        ensure_runtime(connection)
        for entry in entries:
            state = BucketLines()
            with lock:
                said[rank].append(state)
            command = runtime.program_command("bucket-data", entry.verb)
            stdin = entry.stdin(access(entry))
            with connection.stream(
                command, idle_timeout_s=QUIET_S, max_line=MAX_LINE, stdin=stdin
            ) as lines:
                for line in lines:
                    with lock:
                        state.feed(line)
                    tick()
                    if halt:
                        return
                    if timeout_s is not None and time.monotonic() - started > timeout_s:
                        state.error = f"not done after {timeout_s:.0f} s"
                        state.kind = "other"
                        break
                status = lines.exit_status() if state.error is None else 1
            if status != 0 or state.error is not None or state.done is None:
                raise _failure(cluster, rank, entry, state)

    tick(force=True)
    try:
        cluster.map(node)
    finally:
        tick(force=True)
    if halt:
        raise halt[0]
    return said


def _failure(cluster: Cluster, rank: int, entry: BucketWork, state: BucketLines) -> DataError:
    node = f"node {rank} ({cluster.instances[rank].instance_id})"
    reason = state.error or "it ended without saying it was done"
    if state.error is None and state.other:
        reason += ": " + " | ".join(state.other[-3:])
    kind = state.kind or "other"
    return DataError(f"{entry.label}: {reason} (on {node})", hint=_HINTS[kind])
