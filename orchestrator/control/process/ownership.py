"""Whose nodes are whose: a ledger ends only its own nodes, a job is driven only as its identity.

Pure functions, no I/O. Two rules:

- Ownership. Every node orch launches carries the id of its ledger (`Instance.ledger_id`, the
  `orch-ledger` tag on AWS). A node is this ledger's when it carries this ledger's id, or when
  it carries no ledger id at all but this ledger holds a lease on it (a node launched before
  nodes were tagged with their ledger). Every other node, of another ledger or untagged, is not
  ours: it is listed, never ended. The login name (`orch-owner`) is only a label.
- Identity. A job records the cloud identity it was launched as (`Job.identity`,
  `Lease.identity`). A controller acting as another identity (another account, region or
  endpoint: a shell with another AWS profile, `ORCH_AWS_REGIONS`, endpoint) would see none of
  the job's nodes, take them for gone and launch a second cluster: it refuses instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.errors import IdentityMismatch
from orchestrator.providers.base import CloudIdentity, Instance


@dataclass(frozen=True)
class Partition:
    """Instances split by whose they are."""

    ours: list[Instance]  # this ledger's: may be ended
    others: list[Instance]  # another ledger's, or untagged and unleased: never touched


def not_ours_line(instance_ids: Iterable[str]) -> str | None:
    """The line for people, e.g. "3 instances of another ledger: not ours (i-..., ...)";
    None when there are none."""
    ids = sorted(instance_ids)
    if not ids:
        return None
    noun = "instance" if len(ids) == 1 else "instances"
    return f"{len(ids)} {noun} of another ledger: not ours ({', '.join(ids)})"


def is_ours(instance: Instance, ledger_id: str, leased: frozenset[str] = frozenset()) -> bool:
    """Whether `instance` belongs to the ledger `ledger_id`, which holds leases on `leased`."""
    if instance.ledger_id is not None:
        return instance.ledger_id == ledger_id
    return instance.instance_id in leased


def partition(
    instances: Iterable[Instance], ledger_id: str, *, leased: Iterable[str] = ()
) -> Partition:
    """Split `instances` into this ledger's and the others, keeping their order.

    `leased`: ids of the nodes this ledger holds leases on (open or closed); they make an
    instance with no ledger tag ours.
    """
    claimed = frozenset(leased)
    ours: list[Instance] = []
    others: list[Instance] = []
    for instance in instances:
        (ours if is_ours(instance, ledger_id, claimed) else others).append(instance)
    return Partition(ours=ours, others=others)


def _parse(recorded: str) -> CloudIdentity | str:
    try:
        return CloudIdentity.from_json(recorded)
    except ValueError:
        return recorded


def check_identity(job_id: str, recorded: Iterable[str | None], current: CloudIdentity) -> None:
    """Raise `IdentityMismatch` unless every recorded identity (JSON; None: not recorded) of
    job `job_id` is `current`. The message names both and says what to do."""
    for text in recorded:
        if text is None:
            continue
        known = _parse(text)
        if known == current:
            continue
        started = known.describe() if isinstance(known, CloudIdentity) else repr(known)
        raise IdentityMismatch(
            f"job {job_id} was started as {started}, but this controller acts as "
            f"{current.describe()}: it will not adopt, end or relaunch the job's nodes",
            hint="run orch from the shell that started the job (its AWS profile or credentials, "
            "ORCH_AWS_REGIONS and ORCH_AWS_ENDPOINT_URL, or the ORCH_HOME on its host); "
            "nothing was touched",
        )
