"""How much one collection may bring home: pure rules over what the nodes report.

Sizes in a manifest are a node's word, so they plan a pull and bound it, and are checked
against what arrives (`orchestrator.cluster.checkpoints.collector`); they are never trusted
to be true. Before a pull:

- a checkpoint bigger than `checkpoint.max_pull_bytes` is never pulled (one event says so and
  which setting to change); one collection brings home at most that many bytes in all, the
  newest directory checkpoint first, and what does not fit waits for the next collection;
- a checkpoint that would leave the mirror's disk with less than `headroom` free is not pulled
  (one event says where and how much is free).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.cluster.checkpoints.units import Unit
from orchestrator.node.checkpoint_files import shown
from orchestrator.node.checkpoint_protocol import Notice

HEADROOM_BYTES = 1024**3  # kept free on the mirror's disk: 1 GiB, or 5% of a smaller disk


def headroom(total: int) -> int:
    """Bytes a pull leaves free on a disk of `total` bytes."""
    return min(HEADROOM_BYTES, total // 20)


def size_text(size: int) -> str:
    return f"{size} bytes" if size < 10**6 else f"{size / 1e6:.1f} MB ({size} bytes)"


@dataclass(frozen=True)
class Disk:
    """The disk that holds the mirror, as `shutil.disk_usage` saw it just before the pull."""

    where: str  # the folder it was asked about
    free: int
    total: int


@dataclass
class PullPlan:
    """What one collection fetches: `take` (in the order given), and notices of what it
    refused for good (over the cap, or no room on the disk)."""

    take: list[Unit] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)


def plan_pull(
    wanted: Sequence[Unit], missing: Callable[[Unit], int], *, cap: int, disk: Disk
) -> PullPlan:
    """Which of `wanted` (directories oldest first, then single files) one collection pulls.
    `missing(unit)`: the bytes it needs fetched (what the mirror lacks); `cap`: the most bytes
    one checkpoint, and one collection, may bring (0: no cap)."""
    plan = PullPlan()
    room = max(0, disk.free - headroom(disk.total))
    budget = room if cap <= 0 else min(cap, room)
    directories = [u for u in wanted if u.kind != "file"]
    chosen: set[int] = set()
    for unit in [*reversed(directories), *(u for u in wanted if u.kind == "file")]:
        size = missing(unit)
        if cap > 0 and size > cap:
            plan.notices.append(_over_cap(unit, size, cap))
        elif size > room:
            plan.notices.append(_no_room(unit, size, disk))
        elif size <= budget:
            budget -= size
            chosen.add(id(unit))
    plan.take = [u for u in wanted if id(u) in chosen]
    return plan


def _over_cap(unit: Unit, size: int, cap: int) -> Notice:
    return Notice(
        f"cap:{unit.name}",
        f"checkpoint '{shown(unit.name)}' ({size_text(size)}) is not pulled to this machine: "
        f"it is over checkpoint.max_pull_bytes ({size_text(cap)}). Raise that setting "
        "(ORCH_CHECKPOINT_MAX_PULL_BYTES), or keep checkpoints in a store (checkpoint.store) "
        "with checkpoint.mirror: none",
    )


def _no_room(unit: Unit, size: int, disk: Disk) -> Notice:
    return Notice(
        f"disk:{unit.name}",
        f"checkpoint '{shown(unit.name)}' ({size_text(size)}) is not pulled: {disk.where} has "
        f"{size_text(disk.free)} free and orch keeps {size_text(headroom(disk.total))} of it "
        "free. Free some space there (it is pulled at the next collection that fits), or set "
        "checkpoint.mirror: latest (or none, with a store)",
    )
