"""Which checkpoints a restart must not leave in view on the nodes: the pure rule behind
setting aside what survivors hold (`orchestrator.cluster.checkpoints.set_aside`).

After a partial replacement the nodes that stayed keep their checkpoint directories, and with
them whatever the run wrote last: a DCP `step-N/` whose `.metadata` and own shards survived
while a lost node's shards did not, a `step_N.pt` the controller never took, per-rank files of
a step some ranks never wrote. A script that resumes the newest step it finds (torchtitan
does) would pick such a step on one node and not on another. So before the restart, every
step the nodes do not all hold whole, newer than the step the restart resumes, is moved out of
sight on every node that holds it.

Words used here:

- a **step entry** is the part of a path, from the top of the checkpoint directory, up to and
  including the first part whose name gives a step (`named_step`): `step-000088/`,
  `step_88.pt`, `rank1/step_88.pt`, `epoch=3-step=88.ckpt`, `checkpoint-500/`;
- its **family** is the word that names the step (`step`, `global_step`, `iter`, `checkpoint`,
  `epoch`, ...): steps are compared within a family only (epoch 3 is not older than step 80);
- a step (all entries of one family with one step number) is **whole** when every node holds
  the same files of it (paths and sizes) and it has at least as many files as the step before
  it in its family (`step_84_rank{0..3}.pt` then `step_88_rank{0,1}.pt`: step 88 lacks two).
  So a script whose later steps legitimately hold fewer files than earlier ones sees those
  set aside (kept, with an event), never lost.

The rule (`set_aside_plan`): in the family of the directory checkpoint the restart resumes
(`ORCH_RESUME_FROM`), every step newer than that one goes aside, whole or not: the controller
chose it. In any other family, every step newer than the newest whole step of that family goes
aside (all of them when none is whole). Older steps stay, whole or not: a script that picks
the newest finds the resume step first. Nothing else is touched.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

# The words that name a step in a checkpoint's name, in order of preference: a name that gives
# an epoch and a step (`epoch=3-step=88.ckpt`) is ordered by its step.
_WORDS = (
    ("global_step", "step", "iteration", "iter"),
    ("checkpoint", "ckpt"),
    ("epoch",),
)
_PREFERENCE = {word: rank for rank, words in enumerate(_WORDS) for word in words}
_NAMED = re.compile(
    r"(?<![A-Za-z0-9])(" + "|".join(w for words in _WORDS for w in words) + r")[-_=]?(\d+)"
    r"(?=$|[^0-9A-Za-z])",
    re.IGNORECASE,
)


def _named(name: str) -> re.Match[str] | None:
    """The match that names the step of `name` (see `named_step`), or None."""
    found = list(_NAMED.finditer(name))
    if not found:
        return None
    best = min(_PREFERENCE[m.group(1).lower()] for m in found)
    return [m for m in found if _PREFERENCE[m.group(1).lower()] == best][-1]


def named_step(name: str) -> tuple[str, int] | None:
    """(family, step) of one file or directory name, else None: `step-000088` gives
    ("step", 88), `step_88_rank1.pt` ("step", 88), `epoch=3-step=88.ckpt` ("step", 88),
    `checkpoint-500` ("checkpoint", 500), `last.ckpt` and `ckpt` None. The word must stand on
    its own (`mystep5` names none) and the number end at a separator or the name's end."""
    match = _named(name)
    return (match.group(1).lower(), int(match.group(2))) if match else None


@dataclass(frozen=True)
class StepEntry:
    """The step entry a path belongs to (see the module docstring)."""

    path: str  # relative to the checkpoint directory: what is moved aside as one
    family: str
    step: int


def step_entry(path: str) -> StepEntry | None:
    """The step entry of a path under the checkpoint directory, or None when no part of it
    names a step."""
    parts = PurePosixPath(path).parts
    for depth, part in enumerate(parts):
        named = named_step(part)
        if named is not None:
            return StepEntry("/".join(parts[: depth + 1]), *named)
    return None


Listing = Mapping[str, int]  # one node's files under the checkpoint directory: path -> size


def _holdings(listing: Listing) -> dict[StepEntry, frozenset[tuple[str, int]]]:
    """Each step entry of one node's listing with the files it holds of it."""
    held: dict[StepEntry, set[tuple[str, int]]] = {}
    for path, size in listing.items():
        entry = step_entry(path)
        if entry is not None:
            held.setdefault(entry, set()).add((path, size))
    return {entry: frozenset(files) for entry, files in held.items()}


def _newest_whole(
    family: str,
    steps: Collection[int],
    holdings: Mapping[int, Mapping[StepEntry, frozenset[tuple[str, int]]]],
) -> int | None:
    """The newest step of `family` that is whole on the nodes of `holdings` (all nodes)."""
    before = 0  # files of the step before
    whole: int | None = None
    for step in sorted(steps):
        per_node = [
            {e: files for e, files in node.items() if (e.family, e.step) == (family, step)}
            for node in holdings.values()
        ]
        count = len({f for node in per_node for files in node.values() for f in files})
        if all(node == per_node[0] for node in per_node) and count >= before:
            whole = step
        before = count
    return whole


def _newer(entry: StepEntry, limits: Mapping[str, int | None]) -> bool:
    """Whether `entry` is newer than its family's limit (None: every step of it is)."""
    if entry.family not in limits:
        return False
    limit = limits[entry.family]
    return limit is None or entry.step > limit


def set_aside_plan(
    listings: Mapping[int, Listing],
    *,
    resume: str | None,
    known: bool = True,
    held_back: Collection[str] = (),
) -> dict[int, tuple[str, ...]]:
    """The step entries each node must move out of its checkpoint directory before a restart
    (see the module docstring), by node; nodes with nothing to move are left out.

    `listings`: every node's files (path -> size) once the resume checkpoint was put back.
    `known`: whether they are whole (every node answered with all its files); when not, only
    the rule of the resume's family applies, since no other step can be shown whole.
    `resume`: the directory checkpoint the restart resumes, relative to the checkpoint
    directory ('.' or None: none, or one without a step). `held_back`: checkpoints a run could
    not load; in their family every step from theirs on goes aside too, whole or not.
    """
    resume_step = named_step(PurePosixPath(resume).name) if resume and resume != "." else None
    held_steps = [h for h in (named_step(PurePosixPath(n).name) for n in held_back) if h]
    holdings = {rank: _holdings(listing) for rank, listing in listings.items()}
    families: dict[str, set[int]] = {}
    for node in holdings.values():
        for entry in node:
            families.setdefault(entry.family, set()).add(entry.step)
    limits: dict[str, int | None] = {}
    for family, steps in families.items():
        if resume_step is not None and family == resume_step[0]:
            limits[family] = resume_step[1]
        elif known:
            limits[family] = _newest_whole(family, steps, holdings)
        caps = [held[1] - 1 for held in held_steps if held[0] == family]
        if caps:
            limit = limits.get(family, min(caps))  # not known: the cap alone
            limits[family] = None if limit is None else min(limit, *caps)
    plan: dict[int, tuple[str, ...]] = {}
    for rank, node in sorted(holdings.items()):
        moved = sorted(entry.path for entry in node if _newer(entry, limits))
        if moved:
            plan[rank] = tuple(moved)
    return plan
