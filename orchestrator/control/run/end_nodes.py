"""Ending nodes by their ids, outside a run's own teardown (`orch cancel`, `orch down`, `orch
reconcile`), and the two steps every ending shares: a lease for a node the ledger never
recorded, so its seconds are billed, and the fence held while the provider is asked, so that no
controller whose lease was taken ends nodes it no longer drives."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

from orchestrator.control.run.unrecorded import (
    LEDGER_FAILURES,
    DeferredWrites,
    UnrecordedEnd,
    save_unrecorded,
)
from orchestrator.errors import LedgerError, OrchError, UnknownJob
from orchestrator.ledger.store import Lease, Ledger
from orchestrator.providers.base import Instance, Provider


def lease_unrecorded(
    ledger: Ledger,
    provider: Provider,
    job_id: str,
    instance_ids: Iterable[str],
    *,
    known: Iterable[Instance] = (),
) -> list[str]:
    """Open a lease for each of these nodes of job `job_id` that has none; returns their ids.

    Such a node was launched by a controller that died before it wrote the lease. Its lease
    starts at the node's launch time, at the price the provider recorded at launch. Nodes are
    described from `known`, else asked of the provider; a job the ledger does not know gets no
    lease (there is nothing to bill it to).
    """
    try:
        ledger.get_job(job_id)
    except UnknownJob:
        return []
    missing = set(instance_ids) - {lease.instance_id for lease in ledger.leases(job_id)}
    if not missing:
        return []
    described = {i.instance_id: i for i in known}
    if not missing <= described.keys():
        described.update({i.instance_id: i for i in provider.list_owned(job_id=job_id)})
    leased = []
    for instance in (described[iid] for iid in sorted(missing) if iid in described):
        ledger.open_lease(
            Lease.from_instance(
                instance, job_id=job_id, provider=provider.name, identity=identity_json(provider)
            )
        )
        ledger.add_event(
            job_id, "LEASED", f"node {instance.rank}: {instance.instance_id} ran without a lease "
            f"(its launch was cut short); billed from its launch at ${instance.price_per_hour}/h",
        )  # fmt: skip
        leased.append(instance.instance_id)
    return leased


def identity_json(provider: Provider) -> str | None:
    """The provider's identity as a lease records it; None when the cloud cannot say."""
    try:
        return provider.identity().to_json()
    except OrchError:
        return None


def hold_fence(ledger: Ledger, count: int, report: Callable[[str], None]) -> None:
    """Right before a provider's terminate: on a fenced ledger (`ledger.fencing`), check the
    caller's controller lease and renew it for its length, so that no controller takes it
    over by expiry before the terminate went out. `LeaseLost` when it is another's: end
    nothing. A ledger that does not answer does not hold the nodes up (it never does at a
    termination): `report` says so and the nodes are ended; callers whose ledger already
    refused a write skip the check (the controller's renewal thread stops it before its
    lease could run out).

    What is left: a process paused for longer than a lease between this check and the
    provider's call sends the call when it resumes, after another controller may have taken
    the lease over (nothing between the ledger and the cloud can take back a call in flight)."""
    try:
        ledger.hold_fence(f"end {count} node(s)")
    except LEDGER_FAILURES as exc:
        report(f"[orch] could not check the controller lease before ending nodes ({exc}); "
               "ending them")  # fmt: skip


def end_nodes(
    ledger: Ledger,
    provider: Provider,
    job_id: str,
    instance_ids: list[str],
    *,
    home: Path | None = None,
) -> None:
    """Terminate nodes and close their leases at the provider's acknowledged end time (nodes
    without a lease get one first: `lease_unrecorded`).

    The termination never waits on the ledger: its writes are best effort, tried once more
    after the nodes ended. What the ledger still refuses is saved under `home`/unrecorded/
    (ORCH_HOME; `finish_unrecorded` writes it later) and `LedgerError` is raised, the nodes
    being gone by then.
    """
    lines: list[str] = []
    writes = DeferredWrites(lines.append)
    with contextlib.suppress(OrchError):  # cannot describe them: they end unleased
        writes.write(
            "leases of nodes launched without one",
            lambda: lease_unrecorded(ledger, provider, job_id, instance_ids),
        )
    if writes.error is None:  # a ledger that refused a write is not waited on again
        hold_fence(ledger, len(instance_ids), lines.append)
    ended_at = provider.terminate(sorted(instance_ids))
    writes.write("the end of their leases", lambda: ledger.close_leases(instance_ids, ended_at))

    def event() -> None:
        with contextlib.suppress(UnknownJob):  # nodes of a job the ledger never knew
            ledger.add_event(
                ledger.get_job(job_id).id, "TERMINATED", f"{len(instance_ids)} node(s)"
            )

    writes.write("the TERMINATED event", event)
    left = writes.retry()
    if not left:
        return
    ended = f"{', '.join(sorted(instance_ids))} ended at {ended_at.isoformat()}"
    kept = "not kept (no ORCH_HOME given)"
    if home is not None:
        record = UnrecordedEnd(job_id, [(sorted(instance_ids), ended_at)])
        try:
            kept = f"kept in {save_unrecorded(home, record)}"
        except OSError as exc:
            kept = f"not kept ({exc})"
    raise LedgerError(
        f"{job_id}: nodes {ended}, but the ledger refused writes ({writes.error}); "
        f"not written: {'; '.join(left)}; {kept}",
        hint="free the ledger (disk space, the process holding its lock), then run "
        "`orch reconcile`: it closes the leases at the time above",
    )
