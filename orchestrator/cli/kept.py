"""`orch submit --cluster`'s flags and the kept clusters `orch status` lists."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import typer

from orchestrator.cli.flags import duration
from orchestrator.errors import OrchError, SpecError

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.control.run.kept_turn import KeptRequest
    from orchestrator.ledger.store import Ledger


def kept_request(
    cluster: str | None, autostop: str | None, no_wait: bool, yes: bool
) -> KeptRequest | None:
    """The flags of a kept cluster, checked (exit 2) before anything is read or launched."""
    from orchestrator.control.run.kept_turn import (
        DEFAULT_AUTOSTOP_S,
        KeptRequest,
        check_cluster_name,
    )

    if cluster is None:
        if autostop is not None:
            raise SpecError("--autostop is for kept clusters", hint="add --cluster NAME")
        return None  # --no-wait alone is for a fleet's queue (`commands.refuse_a_queue`)
    autostop_s: float | None = DEFAULT_AUTOSTOP_S
    if autostop == "never":
        if not yes:
            raise SpecError(
                "--autostop never keeps the cluster billing until `orch down`",
                hint="add --yes to mean it, or give a duration such as --autostop 30m",
            )
        autostop_s = None
    elif autostop is not None:
        try:
            autostop_s = duration(autostop)
        except typer.BadParameter as exc:
            raise SpecError(
                f"--autostop: {exc.message}", hint="give a duration such as 10m, or never"
            ) from None
    return KeptRequest(check_cluster_name(cluster), autostop_s, wait=not no_wait)


def kept_clusters(settings: Settings, ledger: Ledger) -> list[dict]:
    """The UP kept clusters; one of this machine's whose autostop is due is first asked of
    its provider (its guards may have ended it), so its bill stops where its nodes did."""
    from orchestrator.ledger.clusters import Clusters

    clusters = Clusters(ledger).all(up_only=True)
    if not clusters:
        return []
    from orchestrator.control.run.kept_turn import cluster_scope, is_mine, settle
    from orchestrator.ledger.clusters import autostop_left
    from orchestrator.ledger.store import utcnow
    from orchestrator.providers import get_provider
    from orchestrator.report.clusters import clusters_document

    now, scope = utcnow(), cluster_scope(settings)
    for cluster in (c for c in clusters if is_mine(c, scope)):  # others': their owner's
        left = autostop_left(cluster, now)
        if left is not None and left < 0:
            with contextlib.suppress(OrchError):
                settle(ledger, get_provider(cluster.provider, settings), cluster)
    return clusters_document(ledger, utcnow(), up_only=True)
