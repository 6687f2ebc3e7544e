"""Replacing only the nodes a run lost: which nodes survive an interruption, and the launch
of one replacement per lost node beside them.

A reclaim of one node of four used to end all four and launch four new ones: three boots,
three setups and the time it takes were paid again for nothing. Survivors stay now. Their run
is stopped (after a notice, once its emergency checkpoint is written), their run state is
cleared, and the replacements take the lost ranks, in the survivors' zone, on their instance
type and market. The checkpoint files a survivor holds stay where they are; the mirror's push
before the restart only fills in what it lacks. When the zone cannot give the replacements
(capacity refused within the launch's bounded retries) the survivors end too and the whole
cluster moves, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.providers.base import Instance, LaunchRequest, Provider


def survivors(attempt: Attempt, interruption: Interruption, provider: Provider) -> list[Instance]:
    """The nodes of `attempt` that may stay for the restart: not interrupted, not found gone,
    not missing the last check, and not reported taken by the provider. Empty when none, or
    when every node of the attempt is lost (then nothing is worth keeping)."""
    if not attempt.connected or not attempt.instances:
        return []
    out = set(interruption.ranks) | set(attempt.gone_ranks)
    if attempt.watch is not None:
        out |= {rank for rank, misses in enumerate(attempt.watch.misses) if misses}
    left = [i for i in attempt.instances if i.rank not in out]
    if not left:
        return []
    taken = provider.preempted([i.instance_id for i in left])
    return [i for i in left if i.instance_id not in taken]


def lost_ranks(survivors: Sequence[Instance], nodes: int) -> tuple[int, ...]:
    """The ranks of a `nodes`-node run that no survivor holds: those the replacements take."""
    held = {i.rank for i in survivors}
    return tuple(rank for rank in range(nodes) if rank not in held)


def replacement_request(request: LaunchRequest, survivors: Sequence[Instance]) -> LaunchRequest:
    """`request` (the job's whole launch) narrowed to the nodes the survivors lack: their
    ranks only, in the survivors' zone, of their instance type and on their market, so that
    the restarted run is of one kind again."""
    first = survivors[0]
    ranks = lost_ranks(survivors, request.count)
    return replace(
        request,
        count=len(ranks),
        ranks=ranks,
        spot=first.market == "spot",
        instance_types=(first.instance_type,),
        zones=(first.zone,) if first.zone else request.zones,
        avoid_zones=(),
    )


def joined(survivors: Sequence[Instance], replacements: Sequence[Instance]) -> list[Instance]:
    """Survivors and replacements as one run's nodes, by rank; ValueError unless the ranks are
    exactly 0..n-1 (a provider that ignored the ranks asked for)."""
    nodes = sorted([*survivors, *replacements], key=lambda i: i.rank)
    if [i.rank for i in nodes] != list(range(len(nodes))):
        raise ValueError(f"ranks {[i.rank for i in nodes]} do not make one run")
    return nodes


def market_matches(
    survivors: Sequence[Instance], launch_spot: bool | None, zone: str | None = None
) -> bool:
    """Whether the market the next launch is meant for (`launch_spot`, None: the spec's own
    choice, any) is the survivors', and so is its zone (`zone`, a zone-aware spot policy's
    choice; None: any); a spot policy that moves the job off them moves it whole."""
    if not survivors:
        return True
    if zone is not None and survivors[0].zone not in (None, zone):
        return False
    return launch_spot is None or (survivors[0].market == "spot") is launch_spot
