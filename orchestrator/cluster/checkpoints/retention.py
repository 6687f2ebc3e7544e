"""What the checkpoint store keeps of a job: pure rules, applied by the controller.

The store holds every version the nodes uploaded; the controller deletes what no rule keeps:

- each checkpoint name keeps its newest `keep_versions` complete versions (a snapshot saved in
  place every few minutes keeps the last two, not all of them);
- a directory checkpoint the nodes no longer hold (the script removed it, keeping its own
  last K) goes too, once every node answered to say so;
- the newest complete directory checkpoint, and the newest version of every single file, are
  always kept, whatever the rules above say.

A file shared by versions (a shard that did not change) stays while any kept version uses it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredVersion:
    """One complete version of a checkpoint in the store, as the ledger records it."""

    record_id: int  # ledger ids grow with time: a higher id is a newer version
    name: str
    kind: str  # step | dcp | file
    step: int | None
    keys: frozenset[str]


def _order(version: StoredVersion) -> tuple[int, int]:
    return (-1 if version.step is None else version.step, version.record_id)


def retire(
    versions: Collection[StoredVersion],
    *,
    present: Collection[str] | None,
    keep_versions: int = 2,
) -> set[int]:
    """The record ids of versions the store need not keep (see the module docstring).

    `present`: names of directory checkpoints some node still holds; None when unknown."""
    by_name: dict[str, list[StoredVersion]] = {}
    for version in versions:
        by_name.setdefault(version.name, []).append(version)
    directories = [v for v in versions if v.kind != "file"]
    newest_directory = max(directories, key=_order).record_id if directories else None
    retired: set[int] = set()
    for name, group in by_name.items():
        group.sort(key=lambda v: v.record_id)
        newest = group[-1]
        for version in group[:-keep_versions] if keep_versions > 0 else group:
            retired.add(version.record_id)
        gone = present is not None and newest.kind != "file" and name not in present
        if gone:
            retired.update(v.record_id for v in group)
        if newest.kind == "file":
            retired.discard(newest.record_id)
    if newest_directory is not None:
        retired.discard(newest_directory)
    return retired


def keys_to_delete(versions: Iterable[StoredVersion], retired: Collection[int]) -> set[str]:
    """Keys only retired versions use."""
    versions = list(versions)
    kept = {key for v in versions if v.record_id not in retired for key in v.keys}
    return {key for v in versions if v.record_id in retired for key in v.keys} - kept
