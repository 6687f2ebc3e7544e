"""Having a job's container image on every node before its start.

All nodes pull at once (each from the registry, with its own credentials or role), each one
command over SSH whose lines say how far it got (`orchestrator.node.container.PullProgress`).
While they pull, `progress` hears at most once a second how many layers and bytes the nodes
have (a pull of a large image takes minutes, and the nodes bill meanwhile). A node that has the
image and a `pull: missing` job skips the pull: a kept cluster's next job starts at once.

Every node's output is data: lines are bounded by the stream, counts parsed strictly, and only
the last lines of a failed pull are quoted in the error. A failure raises `ContainerError`
naming the image, the node and what to do; the caller ends the nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.cluster.connections import Cluster
from orchestrator.errors import ContainerError, OrchError
from orchestrator.node.container import PULL_TIMEOUT_S, PullPlan, PullProgress, pull_failure
from orchestrator.node.container import pull_script as build_pull_script
from orchestrator.remote.ssh import NodeConnection

MAX_LINE = 4096  # bytes of one line of a node's pull output kept
QUIET_S = 600.0  # a pull that prints nothing for this long is stalled
REPORT_EVERY_S = 1.0


@dataclass(frozen=True)
class PullReport:
    """How the image came to the nodes."""

    seconds: float
    pulled: int  # nodes that pulled it
    present: int  # nodes that had it already
    bytes_received: int  # what the pulling nodes received meanwhile, all together

    def describe(self, image: str) -> str:
        """The event's text: `pulled IMAGE on 2 node(s) in 7.1 s (56.0 MiB received)`."""
        if not self.pulled:
            return f"{image} already on {self.present} node(s): no pull"
        kept = f", already on {self.present} node(s)" if self.present else ""
        return (
            f"pulled {image} on {self.pulled} node(s) in {self.seconds:.1f} s "
            f"({self.bytes_received / 2**20:.1f} MiB received){kept}"
        )


def _summary(image: str, progress: list[PullProgress], started: float) -> str:
    total = sum(p.layers_total for p in progress)
    done = sum(p.layers_done for p in progress)
    received = sum(p.bytes_received for p in progress)
    ready = sum(1 for p in progress if p.present or p.pulled)
    return (
        f"pulling {image}: {ready}/{len(progress)} node(s) ready, {done}/{total} layers, "
        f"{received / 2**20:.1f} MiB received, {time.monotonic() - started:.0f} s"
    )


def pull_image(
    cluster: Cluster,
    plans: list[PullPlan],
    *,
    password: str | None,
    progress: Callable[[str], None],
    timeout_s: float = PULL_TIMEOUT_S,
) -> PullReport:
    """Have `plans[rank].image` on every node of `cluster`, fit to run (it has bash, and
    torchrun when the plan needs it). Returns when every node has it; raises
    `ContainerError` for the first node whose pull failed (the others finish first), or
    `NodeUnreachable` for a node that stopped answering."""
    started = time.monotonic()
    states = [PullProgress() for _ in plans]
    lock = threading.Lock()
    last_report = [0.0]

    def report(force: bool = False) -> None:
        with lock:
            now = time.monotonic()
            if not force and now - last_report[0] < REPORT_EVERY_S:
                return
            last_report[0] = now
            text = _summary(plans[0].image, states, started)
        progress(text)

    def pull(rank: int, connection: NodeConnection) -> None:
        plan, state = plans[rank], states[rank]
        stdin = f"{password}\n" if password is not None and plan.username is not None else None
        with connection.stream(
            build_pull_script(plan), idle_timeout_s=QUIET_S, max_line=MAX_LINE, stdin=stdin
        ) as lines:
            for line in lines:
                with lock:
                    state.feed(line)
                report()
                if time.monotonic() - started > timeout_s:
                    state.failure = state.failure or "pull-failed"
                    state.output = [*state.output, f"no image after {timeout_s:.0f} s"]
                    break
            status = lines.exit_status()
        if status != 0 or state.failure is not None or not (state.present or state.pulled):
            name = f"{rank} ({cluster.instances[rank].instance_id})"
            message, hint = pull_failure(plan.image, state, name)
            raise ContainerError(message, hint=hint)

    report(force=True)
    try:
        cluster.map(pull)
    except OrchError:
        report(force=True)
        raise
    report(force=True)
    return PullReport(
        seconds=time.monotonic() - started,
        pulled=sum(1 for s in states if s.pulled),
        present=sum(1 for s in states if s.present),
        bytes_received=sum(s.bytes_received for s in states if s.pulled),
    )
