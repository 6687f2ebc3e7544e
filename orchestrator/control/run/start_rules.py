"""Pure rules of a start that makes no progress (`recovery.start_timeout`): what the nodes'
answers say hangs, and how often the same nodes get another try.

A failed start is restarted on the same nodes `SAME_NODE_RESTARTS` time(s); a start that
fails again fails the job, with the reason the nodes' answers give
(`orchestrator.node.start_report`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.node.start_report import NodeStart

SAME_NODE_RESTARTS = 1  # restarts on the same nodes after a start that made no progress

_DROPPED = (
    "its connection to the master waits in SYN-SENT: packets between the nodes are dropped, "
    "by a firewall or Docker's FORWARD policy"
)


@dataclass(frozen=True)
class FailedStart:
    """The supervisor's decision for a (re)start whose rank 0 made no progress in time."""

    reason: str  # what hangs, in one sentence (the job's reason if it fails)
    details: str  # the last lines of each node, for the event


def may_restart(failed_before: int) -> bool:
    """Whether a failed start gets a restart on the same nodes, after `failed_before` failed
    starts in a row."""
    return failed_before < SAME_NODE_RESTARTS


def ranks_of(node: int, procs_per_node: int) -> str:
    """The global ranks of node `node`: "rank 2" or "ranks 2-3"."""
    first = node * procs_per_node
    if procs_per_node == 1:
        return f"rank {first}"
    return f"ranks {first}-{first + procs_per_node - 1}"


def hang_reason(
    reports: Mapping[int, NodeStart | None],
    *,
    node_ips: Sequence[str],
    master: str | None,
    procs_per_node: int,
    waited_s: float,
    start_timeout_s: float,
) -> FailedStart:
    """What the nodes' answers (`reports`, by rank; None: no answer) say of a start that made
    no progress in `waited_s`. `master` is the rendezvous' "address:port" (None: the run has
    a launcher of its own, orch knows no rendezvous)."""
    head = (
        f"the start made no progress in {waited_s:.0f} s "
        f"(recovery.start_timeout {start_timeout_s:.0f} s): "
    )
    details = "; ".join(
        f"node {rank}: " + (" | ".join(report.tail[-3:]) if report else "did not answer")
        for rank, report in sorted(reports.items())
    )
    return FailedStart(head + _cause(reports, node_ips, master, procs_per_node), details)


def _cause(
    reports: Mapping[int, NodeStart | None],
    node_ips: Sequence[str],
    master: str | None,
    procs_per_node: int,
) -> str:
    if master is None:
        return "rank 0 printed nothing that counts as progress"
    first = reports.get(0)
    reached_master = set(first.peers) if first is not None else set()
    missing = []
    for rank in range(1, len(node_ips)):
        report = reports.get(rank)
        if report is not None and (report.workers or report.to_master == "established"):
            continue
        if node_ips[rank] in reached_master:
            continue
        missing.append(
            f"{ranks_of(rank, procs_per_node)} on node {rank} never reached the master {master}"
            + _why(report)
        )
    if missing:
        return "; ".join(missing) + "; the nodes that reached it waited for them"
    unstarted = [rank for rank, r in sorted(reports.items()) if r is not None and not r.workers]
    if unstarted:
        nodes = ", ".join(str(rank) for rank in unstarted)
        return (
            f"every node reached the master {master}, but torchrun did not start the "
            f"workers of node(s) {nodes}"
        )
    return (
        f"every node's ranks passed the rendezvous at {master}, but rank 0 made no progress "
        "(a step line; for a script that never printed one, any line)"
    )


def _why(report: NodeStart | None) -> str:
    if report is None:
        return " (the node did not answer)"
    if report.setup == "running":
        return " (it is still in its setup)"
    if not report.alive:
        return " (its run ended)"
    if report.to_master == "syn-sent":
        return f" ({_DROPPED})"
    return ""
