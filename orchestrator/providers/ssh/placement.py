"""Where the nodes of a job go on a fleet (pure: no I/O, imports nothing of orch's).

A host offers slots: its GPU indices, or on a host without GPUs process slots 0..cpus-1. A node
takes `slots_per_node` free slots of one host. The rules, for every function here:

- All or nothing: every node of the job is placed, or none (`None`).
- One node of a job per host; never a host that is unhealthy, nor one in `avoid` (the hosts
  the job holds already, or just lost).
- Best fit: the hosts with the fewest free slots that still fit a node are taken first (then
  the host listed first), so the large holes stay for large jobs; on a host, the lowest free
  slots.
- `accelerator` (the spec's, e.g. "A100") is matched against each GPU's name, case-insensitive,
  as a substring ("A100" matches "NVIDIA A100-SXM4-80GB"); a host without GPUs never matches.
  Only matching GPUs of a host count as its free slots then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HostSlots:
    """One host of a fleet as placement sees it: every slot it has, those free now, whether it
    may take nodes, and the GPU name of each slot (in `slots` order; () on a CPU host)."""

    host_id: int
    slots: tuple[int, ...]
    free: tuple[int, ...]
    healthy: bool
    gpu_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Node `rank` of the job goes on host `host_id`, holding `slots` (ascending)."""

    rank: int
    host_id: int
    slots: tuple[int, ...]


def matches(gpu_name: str, accelerator: str) -> bool:
    """Whether a GPU called `gpu_name` is the `accelerator` a spec asks for."""
    return accelerator.strip().lower() in gpu_name.lower()


def usable(host: HostSlots, slots: Iterable[int], accelerator: str | None) -> tuple[int, ...]:
    """The slots among `slots` of `host` a node asking for `accelerator` may take, ascending."""
    if accelerator is None:
        return tuple(sorted(set(slots)))
    names = dict(zip(host.slots, host.gpu_names, strict=False))
    return tuple(sorted(s for s in set(slots) if s in names and matches(names[s], accelerator)))


def place(
    hosts: Sequence[HostSlots],
    *,
    ranks: Sequence[int],
    slots_per_node: int,
    avoid: frozenset[int] = frozenset(),
    accelerator: str | None = None,
) -> list[Placement] | None:
    """A host and slots for each of `ranks` on `hosts` (listed in the fleet's order), by the
    rules above; None when they do not all fit now. No ranks: []. Rank order follows the
    hosts' order: the lowest rank goes on the chosen host listed first."""
    if slots_per_node < 1:
        raise ValueError(f"slots_per_node must be at least 1, not {slots_per_node}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks must be distinct: {list(ranks)}")
    fitting: list[tuple[int, int, HostSlots, tuple[int, ...]]] = []
    for position, host in enumerate(hosts):
        if not host.healthy or host.host_id in avoid:
            continue
        free = usable(host, host.free, accelerator)
        if len(free) >= slots_per_node:
            fitting.append((len(free), position, host, free))
    if len({host.host_id for _, _, host, _ in fitting}) < len(ranks):
        return None
    chosen: list[tuple[int, HostSlots, tuple[int, ...]]] = []
    taken: set[int] = set()
    for _, position, host, free in sorted(fitting, key=lambda item: (item[0], item[1])):
        if len(chosen) == len(ranks):
            break
        if host.host_id not in taken:  # the same host listed twice is still one host
            taken.add(host.host_id)
            chosen.append((position, host, free))
    chosen.sort(key=lambda item: item[0])
    return [
        Placement(rank, host.host_id, free[:slots_per_node])
        for rank, (_, host, free) in zip(sorted(ranks), chosen, strict=True)
    ]


def fits_ever(
    hosts: Sequence[HostSlots],
    nodes: int,
    slots_per_node: int,
    accelerator: str | None,
    *,
    fleet: str | None = None,
) -> str | None:
    """Why a job of `nodes` x `slots_per_node` can never run on the fleet of `hosts`, even
    with every slot free and every host healthy, naming the fleet's size ("fleet gpu-lab has 2
    host(s): 8 + 4 GPUs; the job asks 3 node(s) x 4"); None when it can."""
    whole = [HostSlots(h.host_id, h.slots, h.slots, True, h.gpu_names) for h in hosts]
    fit = place(whole, ranks=range(nodes), slots_per_node=slots_per_node, accelerator=accelerator)
    if fit is not None:
        return None
    name = f"fleet {fleet}" if fleet else "the fleet"
    asks = f"the job asks {nodes} node(s) x {slots_per_node}"
    if accelerator is not None:
        gpus = sorted({n for h in hosts for n in h.gpu_names})
        if not any(matches(n, accelerator) for n in gpus):
            have = ", ".join(gpus) if gpus else "no GPUs"
            return f"{name} has no GPU matching {accelerator!r} (it has {have}); {asks}"
        asks += f" {accelerator}"
    return f"{name} has {len(hosts)} host(s): {_sizes(hosts)}; {asks}, one node per host"


def _sizes(hosts: Sequence[HostSlots]) -> str:
    """ "8 + 4 GPUs", "16 + 16 CPUs", or "8 GPUs + 16 CPUs" for a mixed fleet; "none"."""
    if not hosts:
        return "none"
    kinds = ["GPUs" if host.gpu_names else "CPUs" for host in hosts]
    if len(set(kinds)) == 1:
        return " + ".join(str(len(host.slots)) for host in hosts) + f" {kinds[0]}"
    return " + ".join(f"{len(host.slots)} {kind}" for host, kind in zip(hosts, kinds, strict=True))


def first_in_line(
    queue: Sequence[tuple[str, int, int]],
    hosts: Sequence[HostSlots],
    *,
    accelerators: Mapping[str, str | None] | None = None,
) -> str | None:
    """The first waiter of `queue` ((job_id, nodes, slots_per_node) in queue order) whose
    nodes all fit the hosts' free slots now, or None: a later waiter may start while an
    earlier one does not fit. `accelerators` gives a waiter's accelerator by job id."""
    wanted = accelerators or {}
    for job_id, nodes, slots_per_node in queue:
        fit = place(
            hosts,
            ranks=range(nodes),
            slots_per_node=slots_per_node,
            accelerator=wanted.get(job_id),
        )
        if fit is not None:
            return job_id
    return None
