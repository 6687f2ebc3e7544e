"""Local data over the uplink once: to one node, then node to node over the private network.

`send_local_data` rsyncs each local source to one node (the uplink carries it once, whatever
the node count), then `copy_between_nodes` spreads it in a doubling tree (`fanout_plan`):
every node that holds it sends it to one that does not, with rsync over the nodes' own sshd at
their private addresses. Partial files are kept aside (`node_copy.PARTIAL_DIR`), so a transfer
cut short resumes where it stopped, and a file is never under its final name before it is
whole.

Nodes reach each other with a key pair made for the one transfer (`node_copy`): granted on
the receivers and armed on the senders just before, removed from both afterwards, also when
the transfer failed.

Nodes that are allocations on shared machines (`Instance.home`) have no sshd login of their
own to grant a key to: the user's machine sends the data to each of them directly, at once
(`node_to_node` is False for such a cluster).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.fanout_plan import Meter, Spread, fanout_order, uplink_rank
from orchestrator.errors import (
    ConfigError,
    HostKeyMismatch,
    NodeUnreachable,
    RemoteError,
    TransferTimeout,
)
from orchestrator.remote import node_copy
from orchestrator.remote.keys import HostAddress
from orchestrator.remote.sync import PROGRESS_OPTIONS, push_argv, remote_path, run_rsync_watched

Stage = Literal["uplink", "fan-out"]
PROGRESS_EVERY_S = 1.0
CONNECT_TIMEOUT_S = 10
UNBOUNDED_COPY_S = 7 * 24 * 3600.0  # how long a copy between nodes may take without a timeout
_SIZE_MAX = 1 << 62  # a size a node reports is bounded by this
_TIMEOUT_HINT = (
    "the data may be too large for the time given, or the uplink or the nodes' network slow; "
    "a new attempt resumes where this one stopped"
)


@dataclass(frozen=True)
class TransferProgress:
    """Where a transfer stands: `bytes` of `total` done in `stage` (the fan-out's total is the
    data's size times the nodes it goes to), `rate` in bytes per second over the stage so far,
    `seconds_left` at that rate (None before any byte)."""

    stage: Stage
    bytes: int
    total: int
    rate: float
    seconds_left: float | None


@dataclass(frozen=True)
class StageResult:
    """One stage: the data's bytes it carried (size times copies) and its seconds."""

    bytes: int
    seconds: float


@dataclass(frozen=True)
class FanOutResult:
    """What `send_local_data` did: the node that took the uplink, and each stage."""

    uplink_rank: int
    uplink: StageResult
    fanout: StageResult


Progress = Callable[[TransferProgress], None]


class _Reporter:
    """Calls `progress` at most once per `PROGRESS_EVERY_S` (and at a stage's end)."""

    def __init__(self, stage: Stage, total: int, progress: Progress | None) -> None:
        self.meter = Meter(total=total, started=time.monotonic())
        self.stage: Stage = stage
        self.progress = progress
        self.last = 0.0

    def __call__(self, done: int, *, final: bool = False) -> None:
        now = time.monotonic()
        self.meter.done = min(max(done, 0), self.meter.total) if self.meter.total else done
        if self.progress is None or (not final and now - self.last < PROGRESS_EVERY_S):
            return
        self.last = now
        meter = self.meter
        self.progress(
            TransferProgress(
                self.stage, meter.done, meter.total, meter.rate(now), meter.seconds_left(now)
            )
        )

    def result(self) -> StageResult:
        return StageResult(self.meter.total, time.monotonic() - self.meter.started)


def local_size(path: Path) -> int:
    """Bytes of the regular files at or under `path` (links not followed)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                if not os.path.islink(os.path.join(root, name)):
                    total += info.st_size
    return total


def send_local_data(
    cluster: Cluster,
    sources: list[tuple[Path, str]],
    *,
    holders: Sequence[int] = (),
    progress: Progress | None = None,
    timeout: float | None = None,
    low_priority: bool = False,
) -> FanOutResult:
    """Send each `(local path, node destination)` to every node of `cluster`, the uplink
    carrying it once: rsync to one node (the first of `holders`, nodes that hold an earlier
    copy, else rank 0), then node to node (`copy_between_nodes`).

    A destination is a node path as in `data[].dst` (`~/data`, relative or absolute); a folder
    is copied as its contents, as `orch`'s sync does. Files removed locally stay on the nodes.
    `progress` is called about once a second with each stage's bytes (an exception it raises
    stops the transfer, whose partial files stay for the next call, and is raised as is).
    `timeout` bounds the whole transfer (TransferTimeout). A local source that is gone raises
    ConfigError naming it; node failures raise RemoteError (NodeUnreachable, HostKeyMismatch)."""
    for local, _ in sources:
        if not local.exists():
            raise ConfigError(
                f"data source {local} does not exist (any more)",
                hint="check the path in the job's data[].src, or restore the folder",
            )
    deadline = None if timeout is None else time.monotonic() + timeout
    ranks = [instance.rank for instance in cluster.instances]
    if not node_to_node(cluster):
        return _send_to_each(cluster, sources, deadline, progress, low_priority)
    first = uplink_rank(ranks, holders)
    index = ranks.index(first)
    sizes = [local_size(local) for local, _ in sources]
    report = _Reporter("uplink", sum(sizes), progress)
    sent = 0
    for (local, destination), size in zip(sources, sizes, strict=True):
        argv = push_argv(
            local,
            cluster.addresses[index],
            cluster.identity,
            destination,
            low_priority=low_priority,
            extra=[*PROGRESS_OPTIONS, *node_copy.PARTIAL_OPTIONS],
        )
        before = sent
        run_rsync_watched(
            argv,
            what=f"sending {local} to {cluster.addresses[index].name}",
            tick=lambda done, before=before: report(before + done),
            timeout=_left(deadline),
            timeout_hint=_TIMEOUT_HINT,
        )
        sent += size
    report(sent, final=True)
    uplink = report.result()
    others = fanout_order(ranks, first, holders)
    fanout = copy_between_nodes(
        cluster,
        [destination for _, destination in sources],
        first,
        others,
        progress=progress,
        timeout=_left(deadline),
        low_priority=low_priority,
        size=sum(sizes),
    )
    return FanOutResult(uplink_rank=first, uplink=uplink, fanout=fanout)


def node_to_node(cluster: Cluster) -> bool:
    """Whether the cluster's nodes can copy to each other over their own sshd: not when any
    is an allocation on a shared machine (its login is the machine's, not its own)."""
    return all(instance.home is None for instance in cluster.instances)


def _send_to_each(
    cluster: Cluster,
    sources: list[tuple[Path, str]],
    deadline: float | None,
    progress: Progress | None,
    low_priority: bool,
) -> FanOutResult:
    """Every source from this machine to every node, the nodes at once: all of it is the
    uplink stage (its total the data's size times the nodes), the fan-out is empty."""
    sizes = [local_size(local) for local, _ in sources]
    report = _Reporter("uplink", sum(sizes) * len(cluster.instances), progress)
    done = [0] * len(cluster.instances)
    lock = threading.Lock()  # the nodes' threads report one after another

    def send(index: int) -> None:
        sent = 0
        for (local, destination), size in zip(sources, sizes, strict=True):
            argv = push_argv(
                local, cluster.addresses[index], cluster.identity, destination,
                low_priority=low_priority, extra=[*PROGRESS_OPTIONS, *node_copy.PARTIAL_OPTIONS],
            )  # fmt: skip

            def tick(moved: int, before: int = sent) -> None:
                with lock:
                    done[index] = before + moved
                    report(sum(done))

            run_rsync_watched(
                argv, what=f"sending {local} to {cluster.addresses[index].name}", tick=tick,
                timeout=_left(deadline), timeout_hint=_TIMEOUT_HINT,
            )  # fmt: skip
            sent += size
            done[index] = sent

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(cluster.instances)))) as pool:
        jobs = [pool.submit(send, index) for index in range(len(cluster.instances))]
        failures = [exc for job in jobs if (exc := job.exception()) is not None]
    if failures:
        raise failures[0]
    report(report.meter.total, final=True)
    first = min(instance.rank for instance in cluster.instances)
    return FanOutResult(first, report.result(), StageResult(0, 0.0))


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TransferTimeout("the data transfer ran out of time", hint=_TIMEOUT_HINT)
    return left


def copy_between_nodes(
    cluster: Cluster,
    paths: list[str],
    source_rank: int,
    target_ranks: list[int],
    *,
    progress: Progress | None = None,
    timeout: float | None = None,
    low_priority: bool = False,
    size: int | None = None,
) -> StageResult:
    """Copy `paths` (node paths: `~/ds`, relative to the home, or absolute; a file or a folder,
    each to the same path) from node `source_rank` to every node of `target_ranks`, over their
    private addresses in a doubling tree, with a one-time key granted and removed around it.

    `size`: the bytes of `paths` when known (else the source node is asked; its answer only
    feeds progress). A path missing on the source fails the copy. Raises RemoteError naming
    the two nodes of a failed copy (once every copy under way has ended), TransferTimeout
    past `timeout`, and RemoteError at once when the nodes cannot reach each other's logins
    (`node_to_node`)."""
    if not node_to_node(cluster):
        raise RemoteError(
            "the nodes are allocations on shared machines and do not copy to each other",
            hint="each node gets its data from its own source",
        )
    targets = [rank for rank in dict.fromkeys(target_ranks) if rank != source_rank]
    if not targets or not paths:
        return StageResult(0, 0.0)
    deadline = None if timeout is None else time.monotonic() + timeout
    by_rank = {instance.rank: i for i, instance in enumerate(cluster.instances)}
    for rank in [source_rank, *targets]:
        if rank not in by_rank:
            raise ValueError(f"no node of rank {rank} in the cluster")
    if size is None:
        size = _node_size(cluster, by_rank[source_rank], paths)
    key = node_copy.one_time_key()
    receivers = {rank: _private_address(cluster, by_rank[rank]) for rank in targets}
    senders = [source_rank, *targets[:-1]]  # the last one served never sends
    report = _Reporter("fan-out", size * len(targets), progress)
    try:
        grant = node_copy.authorize_script(key)
        arm = node_copy.arm_script(key, list(receivers.values()))
        homes = dict(zip(senders, _each(cluster, by_rank, senders, arm, key.private_pem),
                         strict=True))  # fmt: skip
        _each(cluster, by_rank, targets, grant)
        spread = Spread([source_rank], targets)
        _spread(cluster, spread, by_rank, homes, receivers, key, paths, deadline, low_priority,
                lambda copies: report(copies * size))  # fmt: skip
        report(size * len(targets), final=True)
    finally:
        _clean(cluster, by_rank, key, targets, senders)
    return report.result()


def _spread(
    cluster: Cluster,
    spread: Spread,
    by_rank: dict[int, int],
    homes: dict[int, str],
    receivers: dict[int, HostAddress],
    key: node_copy.OneTimeKey,
    paths: list[str],
    deadline: float | None,
    low_priority: bool,
    tick: Callable[[int], None],
) -> None:
    """Run the tree's copies as they become possible; stop handing out new ones at the first
    failure, wait for those under way, then raise it."""
    failures: list[RemoteError] = []
    running: dict[Future[None], tuple[int, int]] = {}
    copies = 0
    with ThreadPoolExecutor(max_workers=max(1, len(receivers))) as pool:

        def launch(pairs: list[tuple[int, int]]) -> None:
            for source, target in pairs:
                left = _left(deadline)
                job = pool.submit(
                    _copy, cluster, by_rank[source], homes[source], receivers[target], key,
                    paths, left, low_priority,
                )  # fmt: skip
                running[job] = (source, target)

        launch(spread.start())
        while running:
            done, _ = wait(list(running), timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
            for job in done:
                source, target = running.pop(job)
                try:
                    job.result()
                except RemoteError as exc:
                    failures.append(exc)
                    continue
                copies += 1
                follow = spread.finished(source, target)
                if not failures:
                    try:
                        launch(follow)
                    except TransferTimeout as exc:
                        failures.append(exc)
            tick(copies)
    if failures:
        first = failures[0]
        if len(failures) > 1:
            first.message += f" (and {len(failures) - 1} more copies failed)"
        raise first


def _copy(
    cluster: Cluster,
    index: int,
    home: str,
    receiver: HostAddress,
    key: node_copy.OneTimeKey,
    paths: list[str],
    timeout: float | None,
    low_priority: bool,
) -> None:
    """One copy of the tree: node `index` rsyncs every path to `receiver`."""
    transport = node_copy.node_transport(home, key, CONNECT_TIMEOUT_S)
    limit = None if timeout is None else int(timeout) + 1
    script = " && ".join(
        shlex.join(
            node_copy.node_copy_argv(
                path, receiver, transport, timeout_s=limit, low_priority=low_priority
            )
        )  # fmt: skip
        for path in paths
    )
    sender = cluster.addresses[index].name
    what = f"copying data from {sender} to {receiver.name}"
    # NodeConnection.run's own default is for short commands: a copy may take hours
    wait_s = UNBOUNDED_COPY_S if limit is None else limit + 15
    result = cluster.connections[index].run(script, timeout=wait_s, check=False)
    if result.ok:
        return
    said = " | ".join(line for line in result.tail(lines=5).splitlines() if line.strip())
    if result.exited == 124:
        raise TransferTimeout(f"{what}: did not finish in time; stopped", hint=_TIMEOUT_HINT)
    if "Host key verification failed" in said:
        raise HostKeyMismatch(
            f"{what}: {receiver.name} presented another host key than the one pinned for it",
            hint="the node may have been replaced: `orch down` the cluster and launch again",
        )
    if result.exited == 255 or "connect to host" in said:
        raise NodeUnreachable(
            f"{what}: the nodes could not reach each other over SSH at {receiver.host}: {said}",
            hint="the nodes' network must let them reach each other's sshd (port "
            f"{receiver.port}); on AWS, the cluster's security group does",
        )
    raise RemoteError(f"{what}: rsync exited {result.exited}: {said}")


def _each(
    cluster: Cluster,
    by_rank: dict[int, int],
    ranks: list[int],
    script: str,
    stdin: str | None = None,
) -> list[str]:
    """Run `script` on the nodes of `ranks` at once; the homes they print (`node_home`),
    checked. Raises the first failure once all have ended."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(ranks)))) as pool:
        jobs = [
            pool.submit(
                cluster.connections[by_rank[rank]].run,
                script,
                stdin=stdin,
                timeout=CONNECT_TIMEOUT_S * 3,
            )  # fmt: skip
            for rank in ranks
        ]
        said = [job.result() for job in jobs]
    return [node_copy.node_home(result.stdout) if stdin is not None else "" for result in said]


def _private_address(cluster: Cluster, index: int) -> HostAddress:
    instance = cluster.instances[index]
    return HostAddress(
        name=cluster.addresses[index].name,
        host=instance.private_ip,
        port=instance.ssh_port,
        user=instance.ssh_user,
        host_key=instance.host_key,
    )


def _node_size(cluster: Cluster, index: int, paths: list[str]) -> int:
    """What node `index` says `paths` weigh (`du`), bounded; 0 when it cannot tell."""
    argv = ["du", "-s", "-b", "-c", "--", *(remote_path(p) for p in paths)]
    said = cluster.connections[index].run(argv, check=False, timeout=60, max_output=1 << 16)
    lines = said.stdout.strip().splitlines()
    first = lines[-1].split("\t", 1)[0] if lines else ""
    return min(int(first), _SIZE_MAX) if first.isdigit() else 0


def _clean(
    cluster: Cluster,
    by_rank: dict[int, int],
    key: node_copy.OneTimeKey,
    granted: list[int],
    armed: list[int],
) -> None:
    """Revoke the key on every node it was granted to and remove it from every node it was
    armed on; a node that cannot be reached now is skipped (its copy of the key opens only
    the other nodes of this cluster, whose grants are revoked here)."""
    jobs = [(rank, node_copy.revoke_script(key.token)) for rank in granted] + [
        (rank, node_copy.disarm_script(key.token)) for rank in armed
    ]

    def run(rank: int, script: str) -> None:
        with contextlib.suppress(RemoteError):
            cluster.connections[by_rank[rank]].run(script, timeout=CONNECT_TIMEOUT_S * 3)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(jobs)))) as pool:
        list(pool.map(lambda job: run(*job), jobs))
