"""A member of a shared ledger acts only on the jobs and kept clusters it drives or owns: two
ORCH_HOMEs on one ledger (a `sqlite:///` URL, then PostgreSQL) and one local "cloud", real
local nodes and controllers (`tests.support.shared_homes`).

`orch cancel` of a job another machine drives asks that machine's controller through the
ledger, which stops the job as a local cancel would; a controller that does not take the
request up is named and nothing is touched, unless `--force`, which stops it and ends the
nodes from here. Kept cluster names are each machine's own, and `orch down` ends only this
machine's clusters unless `--force`.
"""

from __future__ import annotations

import json
import threading

import pytest

from orchestrator.ledger.clusters import DOWN, UP, Clusters
from orchestrator.ledger.controller_leases import ControllerLeases
from tests.support.helpers import counter_run
from tests.support.shared_homes import (
    LEASE_S,
    Machine,
    Shared,
    assert_nodes_alive,
    detach,
    kill_controller,
    open_instances,
    state,
    wait_for_state,
)


def running_on_a(shared: Shared) -> tuple[str, list[str]]:
    """A job machine a drives, running until it is stopped (400 steps of 0.25 s, one node);
    its id and its nodes."""
    spec = shared.spec.with_name("long.yaml")
    spec.write_text(
        "name: long\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"run: {counter_run(400, step_s=0.25)}\n"
    )
    job_id = detach(shared.a, spec)
    wait_for_state(shared, job_id, "RUNNING")
    return job_id, open_instances(shared, job_id)


def kinds(shared: Shared, job_id: str) -> list[str]:
    return [event.kind for event in shared.ledger.events(job_id)]


def said(result: object) -> str:
    """A command's stdout and stderr as one line of words (rich wraps long lines)."""
    return " ".join((result.stdout + result.stderr).split())  # type: ignore[attr-defined]


def test_a_cancel_of_a_job_another_machine_drives_is_carried_out_by_its_controller(
    shared: Shared,
) -> None:
    a, b = shared.a, shared.b
    job_id, nodes = running_on_a(shared)
    controller = a.controller_pid(job_id)

    cancelled = b.orch("cancel", job_id, timeout=120)
    assert cancelled.returncode == 0, said(cancelled)
    assert f"asked its controller on machine {a.id} through the ledger" in said(cancelled)
    assert f"job {job_id}: CANCELLED" in said(cancelled)
    job = shared.ledger.get_job(job_id)
    assert (job.state, job.exit_code, job.reason) == ("CANCELLED", 130, "cancelled")
    events = shared.ledger.events(job_id)
    (taken_up,) = [e for e in events if e.kind == "CANCELLING"]
    assert taken_up.message.startswith(f"controller {a.id}:{controller} cancels the job for {b.id}")
    assert "CANCEL_ASKED" in kinds(shared, job_id) and "LEASE_FORCED" not in kinds(shared, job_id)
    ended = [e for e in events if e.kind == "CANCELLED"]
    assert ended == [] or "no live controller" not in ended[0].message  # a's stop, not b's
    assert open_instances(shared, job_id) == [] and nodes
    assert ControllerLeases(shared.ledger).get(job_id) is None


class SilentHolder:
    """A controller of machine `machine` that keeps the job's lease, renewing it every second,
    but never reads a cancel asked of it (as an orch from before cancels were asked through
    the ledger): it takes the lease of the killed controller. `lost` once another took it."""

    def __init__(self, machine: Machine, shared: Shared, job_id: str) -> None:
        self.leases = ControllerLeases(shared.ledger)
        self.job_id, self.holder = job_id, f"{machine.id}:1"
        claim = self.leases.take(job_id, self.holder, machine.id, length_s=LEASE_S,
                                 dead_on_this_machine=True)  # fmt: skip
        assert claim.taken
        self.lost = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._renew, daemon=True)
        self.thread.start()

    def _renew(self) -> None:
        while not self.stopping.wait(1.0):
            if self.leases.renew(self.job_id, self.holder, length_s=LEASE_S) is None:
                self.lost.set()
                return

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


# One database in `make test` (the lease logic they share is run on both by the test above);
# the other in `make soak`.
@pytest.mark.parametrize(
    "shared", [pytest.param("sqlite", marks=pytest.mark.soak), "postgresql"], indirect=True
)
def test_a_controller_that_does_not_take_up_a_cancel_is_named_and_force_ends_the_job(
    shared: Shared,
) -> None:
    a, b = shared.a, shared.b
    job_id, nodes = running_on_a(shared)
    kill_controller(a, job_id)
    holder = SilentHolder(a, shared, job_id)
    try:
        refused = b.orch("cancel", job_id, timeout=120)
        assert refused.returncode == 1, said(refused)
        text = said(refused)
        assert f"job {job_id} is driven by controller {holder.holder} on machine {a.id}" in text
        assert "did not take up the cancel" in text and "nothing touched" in text
        assert f"`orch cancel {job_id} --force`" in text
        assert state(shared, job_id) == "RUNNING" and open_instances(shared, job_id) == nodes
        assert_nodes_alive(nodes)
        lease = ControllerLeases(shared.ledger).get(job_id)
        assert lease is not None and lease.holder == holder.holder and lease.cancel_by is None

        forced = b.orch("cancel", job_id, "--force", timeout=120)
        assert forced.returncode == 0, said(forced)
        text = said(forced)
        warning = f"warning: --force: took the lease of {job_id} from its controller on machine"
        assert f"{warning} {a.id}" in text
        assert "no checkpoint is pulled" in text and f"job {job_id}: CANCELLED by force" in text
        assert holder.lost.wait(5)  # the holder's next renewal found its lease taken
    finally:
        holder.stop()
    job = shared.ledger.get_job(job_id)
    assert (job.state, job.exit_code) == ("CANCELLED", 130)
    assert "LEASE_FORCED" in kinds(shared, job_id)
    (ended,) = [e for e in shared.ledger.events(job_id) if e.kind == "CANCELLED"]
    assert f"by force from machine {b.id}" in ended.message
    assert open_instances(shared, job_id) == []


def kept_job(machine: Machine, shared: Shared) -> str:
    """Run a short job on `machine`'s kept cluster `dev` to its end; its id."""
    spec = shared.spec.with_name("short.yaml")
    spec.write_text(
        "name: short\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"run: {counter_run(4, step_s=0.1)}\n"
    )
    submitted = machine.orch("submit", str(spec), "--cluster", "dev", "--detach", timeout=120)
    assert submitted.returncode == 0, said(submitted)
    job_id = submitted.stdout.strip().splitlines()[-1]
    wait_for_state(shared, job_id, "SUCCEEDED", timeout=120)
    return job_id


@pytest.mark.parametrize(
    "shared", ["sqlite", pytest.param("postgresql", marks=pytest.mark.soak)], indirect=True
)
def test_each_machine_has_its_own_dev_and_down_ends_only_its_own_unless_forced(
    shared: Shared,
) -> None:
    a, b = shared.a, shared.b
    on_a, on_b = kept_job(a, shared), kept_job(b, shared)
    clusters = Clusters(shared.ledger)
    dev_a = clusters.get(shared.ledger.get_job(on_a).cluster_id or "")
    dev_b = clusters.get(shared.ledger.get_job(on_b).cluster_id or "")
    assert dev_a.id != dev_b.id and dev_a.name == dev_b.name == "dev"
    assert (dev_a.machine, dev_b.machine) == (a.id, b.id)
    nodes_a = [i.instance_id for i in clusters.idle_leases(dev_a.id) if i.ended_at is None]
    assert nodes_a

    # b's `down dev` is b's dev; b's `down --all` leaves a's dev alone and names it
    downed = b.orch("down", "dev")
    assert downed.returncode == 0 and "kept cluster dev: down" in said(downed)
    assert clusters.get(dev_b.id).state == DOWN and clusters.get(dev_a.id).state == UP
    everything = b.orch("down", "--all", "--json")
    assert everything.returncode == 0, said(everything)
    document = json.loads(everything.stdout)
    assert document["left_alone"] == [{"name": "dev", "id": dev_a.id, "machine": a.id}]
    assert document["ended"] == [] and document["kept_down"] == []
    refused = b.orch("down", "dev")  # a's only now: refused, named
    assert refused.returncode == 1
    assert f"kept cluster dev ({dev_a.id}) of machine {a.id}: left alone" in said(refused)
    assert clusters.get(dev_a.id).state == UP
    assert_nodes_alive(nodes_a)

    forced = b.orch("down", "dev", "--force")
    assert forced.returncode == 0, said(forced)
    assert "kept cluster dev: down" in said(forced)
    assert clusters.get(dev_a.id).state == DOWN
    assert all(i.ended_at is not None for i in clusters.idle_leases(dev_a.id))
