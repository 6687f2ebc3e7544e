"""`orch down` and `orch reconcile`: ending nodes whatever their job is doing, and putting
everything right after a crash (controllers revived, nodes no live job owns ended)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.flags import JsonFlag
from orchestrator.cli.output import make_console, print_json
from orchestrator.errors import OrchError, SpecError

if TYPE_CHECKING:
    from orchestrator.control.verbs.commands import DownResult


def down_command(
    cluster: Annotated[
        str | None, typer.Argument(help="kept cluster name (or id), or a job id, to shut down")
    ] = None,
    all_clusters: Annotated[
        bool, typer.Option("--all", help="every cluster of this ledger (shared: this machine's)")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="on a shared ledger, also end other machines' kept clusters and the nodes of "
            "jobs other machines drive (their controllers are stopped first; no checkpoint is "
            "pulled)",
        ),
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Terminate a cluster's nodes now (or all of this ledger's), whatever their job is doing;
    nodes of other ledgers are listed, never ended. On a shared ledger, other machines' kept
    clusters and jobs are left alone and named, unless --force."""
    from orchestrator.control.process.ownership import not_ours_line
    from orchestrator.control.verbs import commands
    from orchestrator.ledger.store import ControllerLease

    if (cluster is None) == (not all_clusters):
        raise SpecError("give a cluster name or --all (not both)")
    settings = load_settings()
    console = make_console(stderr=json_out)

    def ended(group: commands.NodesEnded) -> None:
        console.print(
            f"{group.job_id}: terminated {len(group.instance_ids)} {group.provider} node(s)"
        )

    def forced(lease: ControllerLease) -> None:
        make_console(stderr=True).print(
            f"warning: --force: took the lease of {lease.job_id} from its controller on machine "
            f"{lease.machine}, which stops at its next renewal; no checkpoint is pulled",
            highlight=False,
        )

    result = commands.down(
        settings, open_ledger(settings), cluster, force=force, on_ended=ended, on_forced=forced
    )
    refused = cluster is not None and bool(result.left_alone) and not result.ended
    if json_out:
        print_json(_down_document(result))
        if refused:
            raise typer.Exit(1)
        return
    if line := not_ours_line(result.not_ours):
        console.print(line)
    for job_id in result.elsewhere:
        console.print(
            f"{job_id}: another machine drives it (or must revive it: it holds the job's keys);"
            f" left alone: `orch cancel {job_id}` asks its controller (--force ends it here)"
        )
    for other in result.left_alone:
        owner = f"machine {other.machine}" if other.machine else "no recorded machine"
        console.print(
            f"kept cluster {other.name} ({other.cluster_id}) of {owner}: left alone; "
            f"`orch down {other.cluster_id} --force` ends it from here",
            highlight=False,
        )
    for name in result.kept_down:
        console.print(f"kept cluster {name}: down")
    if refused:
        raise OrchError(
            f"kept cluster {cluster} is another machine's: nothing ended",
            hint="end it on the machine that owns it, or add --force",
        )
    if cluster is not None and not (result.ended or result.kept_down or result.elsewhere):
        raise commands.cluster_not_found(cluster)
    if not result.ended and not result.kept_down and not result.elsewhere:
        console.print("nothing to shut down")


def _down_document(result: DownResult) -> dict:
    """`orch down --json`: what was ended, and what was left alone and why."""
    return {
        "ended": [
            {"job": g.job_id, "provider": g.provider, "instances": list(g.instance_ids)}
            for g in result.ended
        ],
        "kept_down": list(result.kept_down),
        "not_ours": list(result.not_ours),
        "elsewhere": list(result.elsewhere),
        "left_alone": [
            {"name": c.name, "id": c.cluster_id, "machine": c.machine} for c in result.left_alone
        ],
        "forced": list(result.forced),
    }


def reconcile_command(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only list what would be revived or ended")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Give unfinished jobs whose controller died a new one; end this ledger's nodes that no
    live job owns (other ledgers' nodes are listed, never ended)."""
    from orchestrator.control.process.ownership import not_ours_line
    from orchestrator.control.repair.reconcile import reconcile as run_reconcile
    from orchestrator.control.verbs.commands import providers_in_use

    settings = load_settings()
    ledger = open_ledger(settings)
    report = run_reconcile(settings, ledger, providers_in_use(settings, ledger), dry_run=dry_run)
    if json_out:
        print_json(
            {
                "terminated": report.terminated,
                "revived": report.revived,
                "not_ours": report.not_ours,
                "recorded": report.recorded,
                "live_elsewhere": report.live_elsewhere,
                "stranded": [s.job_id for s in report.stranded],
                "dry_run": dry_run,
                "nodes": report.nodes,
            }
        )
        return
    console = make_console()
    ended, adopted = ("would terminate", "would get") if dry_run else ("terminated", "got")
    for job_id, ids in report.terminated.items():
        console.print(f"{job_id}: {ended} {len(ids)} node(s) no live job owns: {', '.join(ids)}")
    for job_id in report.revived:
        console.print(f"{job_id}: its controller was gone; it {adopted} a new one")
    if line := not_ours_line(report.not_ours):
        console.print(line)
    for job_id in report.recorded:
        console.print(f"{job_id}: wrote the end its stop could not write into the ledger")
    for job_id in report.live_elsewhere:
        console.print(f"{job_id}: driven by another machine's controller; left alone")
    for stranded in report.stranded:
        console.print(stranded.line(), highlight=False, markup=False)
    if not (report.terminated or report.revived or report.recorded or report.stranded):
        if report.nodes:
            console.print(
                f"nothing to reconcile: each of this ledger's {report.nodes} running node(s) "
                "belongs to a job with a live controller or to a kept cluster"
            )
        else:
            console.print("nothing to reconcile: no nodes of this ledger are running")
