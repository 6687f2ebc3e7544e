"""Bringing a job's results home from its nodes: rank 0's checkpoints and every node's log."""

from __future__ import annotations

import threading
from pathlib import Path

from orchestrator import launch
from orchestrator.checkpoints import (
    CheckpointMirror,
    PulledCheckpoint,
    listing_command,
    parse_listing,
)
from orchestrator.cluster import Cluster
from orchestrator.errors import NodeUnreachable
from orchestrator.remote.sync import pull_argv, run_rsync

LATEST_POINTER = "latest"  # the trainer's pointer to its newest checkpoint, not one itself


def pull_checkpoints(
    cluster: Cluster,
    mirror: CheckpointMirror,
    checkpoint_dir: str,
    *,
    final: bool,
    abort: threading.Event | None = None,
) -> list[PulledCheckpoint]:
    """Mirror what is complete (or stable) in node 0's `checkpoint_dir` (home-relative or
    absolute); returns the checkpoints that became available.

    A node 0 that cannot be reached, or is lost mid-transfer, pulls nothing this time: the
    caller decides whether the node is lost, and the mirror keeps only whole files (a later
    pull fetches the rest). Setting `abort` (node 0 was found gone) ends a transfer in
    progress at once, with the same outcome, instead of when ssh's keepalive gives up."""
    try:
        listing = parse_listing(
            cluster.head.run(
                listing_command(launch.home_expr(checkpoint_dir)), timeout=60, check=False
            ).stdout
        )
    except NodeUnreachable:
        return []

    def fetch(files_from: Path, staging: Path) -> None:
        argv = pull_argv(
            cluster.addresses[0], cluster.identity, checkpoint_dir, staging, files_from=files_from
        )
        # 23/24: some listed file vanished or could not be read (a script rotating its
        # checkpoints); the mirror installs what arrived and the next pull retries the rest.
        run_rsync(argv, what="checkpoint pull", timeout=3600, ok_codes=(0, 23, 24), abort=abort)

    try:
        pulled = mirror.pull(listing, fetch, final=final)
    except NodeUnreachable:
        return []
    return [p for p in pulled if p.name != LATEST_POINTER]
