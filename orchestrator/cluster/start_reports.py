"""Asking every node how far a start that made no progress got (`node.start_report`)."""

from __future__ import annotations

from collections.abc import Collection

from orchestrator.cluster.connections import Cluster
from orchestrator.errors import OrchError
from orchestrator.node.launch import NodeLayout
from orchestrator.node.start_report import (
    REPORT_MAX_OUTPUT,
    NodeStart,
    parse_report,
    report_command,
)
from orchestrator.remote.ssh import NodeConnection

REPORT_TIMEOUT_S = 10.0  # a node that has not answered by then counts as not answering


def start_reports(
    cluster: Cluster,
    layout: NodeLayout,
    master: tuple[str, int],
    *,
    skip: Collection[int] = (),
) -> dict[int, NodeStart | None]:
    """Every node's `NodeStart`, by rank, asked at once; None for a node that did not answer
    (or gave no report), and for the ranks in `skip` (found gone) without asking."""
    command = report_command(layout, *master)

    def ask(rank: int, connection: NodeConnection) -> NodeStart | None:
        if rank in skip:
            return None
        try:
            result = connection.run(
                command, timeout=REPORT_TIMEOUT_S, check=False, max_output=REPORT_MAX_OUTPUT
            )
        except OrchError:
            return None
        return parse_report(result.stdout)

    return dict(enumerate(cluster.map(ask)))
