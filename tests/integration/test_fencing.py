"""Fencing on a shared ledger, on SQLite (a `sqlite:///` URL) and on PostgreSQL: once another
holder took a controller's lease (by force, or once it expired; or took it and released it
since), that controller's writes about the job and its ends of nodes are refused, nothing of
them written and no node ended, and the controller says so once (LEASE_LOST), also when it is
a real process that slept through its lease; a take-over that comes while a fenced write is
in flight waits for it, so the write is never half fenced. The nodes are real local sshd
nodes, driven by the real runner."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import event

from orchestrator.config import Settings, load_settings
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.process.controllers import register_job
from orchestrator.control.process.lease_keeper import LEASE_LOST, LeaseKeeper
from orchestrator.control.run.runner import JobRunner, RunnerOptions
from orchestrator.job_state import JobState
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.fencing import Fence, LeaseLost
from orchestrator.ledger.store import (
    CheckpointRecord,
    GpuSampleRecord,
    Lease,
    Ledger,
    make_engine,
    utcnow,
)
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.spec.loading import load_job
from tests.support.helpers import processes_with_marker
from tests.support.lease_rows import add_job, age_lease
from tests.support.shared_homes import (
    Shared,
    assert_nodes_alive,
    detach,
    open_instances,
    state,
    wait_for_state,
)
from tests.support.waiting import wait_until


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    """The shared ledger at `url` (in place of the SQLite file under tmp_path)."""
    engine = make_engine(url)
    yield Ledger(engine)
    engine.dispose()


def node_lease(job_id: str, instance_id: str) -> Lease:
    return Lease(
        job_id=job_id, cluster=job_id, provider="local", instance_id=instance_id, rank=0,
        market="on-demand", instance_type="local", price_per_hour=Decimal("1"),
        launched_at=utcnow(),
    )  # fmt: skip


def snapshot(ledger: Ledger, job_id: str) -> tuple[object, ...]:
    """Everything of the job a controller writes: its row, events, leases, checkpoints."""
    return (
        ledger.get_job(job_id).model_dump(),
        [(e.kind, e.message) for e in ledger.events(job_id)],
        [lease.model_dump() for lease in ledger.leases(job_id)],
        [c.model_dump() for c in ledger.checkpoints(job_id)],
        [s.model_dump() for s in ledger.gpu_samples(job_id)],
    )


def take_from(ledger: Ledger, job_id: str, how: str) -> None:
    """Another controller ("b:9") takes the lease: by force, once it expired, or takes it
    and releases it again (its job done)."""
    leases = ControllerLeases(ledger)
    if how == "expired":
        age_lease(ledger, job_id, 31)  # it ran out as its holder slept
    assert leases.take(job_id, "b:9", "b", length_s=30, force=how != "expired").taken
    if how == "released":
        assert leases.release(job_id, "b:9")


@pytest.mark.parametrize("how", ["forced", "expired", "released"])
def test_a_fenced_ledger_writes_nothing_once_another_holder_took_the_lease(
    ledger: Ledger, how: str
) -> None:
    add_job(ledger, "f1")
    claim = ControllerLeases(ledger).take("f1", "a:1", "a", length_s=30)
    assert claim.taken and claim.lease is not None
    lost: list[str] = []
    fenced = ledger.fenced(Fence("f1", "a:1", claim.lease.taken_at, 30, on_lost=lost.append))
    # while the lease is a's, its writes go through as on any ledger
    fenced.update_job("f1", state=JobState.PROVISIONING)
    fenced.open_lease(node_lease("f1", "i-1"))
    fenced.add_event("f1", "LAUNCHED", "node 0")
    fenced.hold_fence("end 1 node(s)")
    assert not lost

    take_from(ledger, "f1", how)
    before = snapshot(ledger, "f1")
    writes = {
        "state": lambda: fenced.update_job("f1", state=JobState.STOPPING),
        "event": lambda: fenced.add_event("f1", "STOPPING", "cancelled"),
        "lease": lambda: fenced.open_lease(node_lease("f1", "i-2")),
        "close": lambda: fenced.close_leases(["i-1"], utcnow()),
        "checkpoint": lambda: fenced.add_checkpoint(
            CheckpointRecord(job_id="f1", name="step-1", size_bytes=1, pulled_at=utcnow())
        ),
        "sample": lambda: fenced.add_gpu_samples(
            [GpuSampleRecord(job_id="f1", rank=0, gpu=0, at=utcnow())]
        ),
        "terminate": lambda: fenced.hold_fence("end 1 node(s)"),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLost):
            write()
        assert snapshot(ledger, "f1") == before, name
    assert len(lost) == len(writes)
    if how == "released":
        assert "released by its next holder" in lost[0]
    else:
        assert "held by b:9 (machine b) now" in lost[0]
    assert "about to change f1 (state)" in lost[0] and "about to end 1 node(s)" in lost[-1]
    # the ledger without the fence (another command, a ledger of one's own) is not held back
    ledger.add_event("f1", "NOTE", "unfenced")


def test_a_take_over_that_comes_while_a_fenced_write_is_in_flight_waits_for_it(
    url: str, ledger: Ledger
) -> None:
    add_job(ledger, "f2")
    claim = ControllerLeases(ledger).take("f2", "a:1", "a", length_s=30)
    assert claim.lease is not None
    fenced = ledger.fenced(Fence("f2", "a:1", claim.lease.taken_at, 30))
    checked, go_on = threading.Event(), threading.Event()

    # the fenced write stops right after its check, inside its transaction
    @event.listens_for(ledger.engine, "after_execute")
    def _pause(conn: object, clause: object, *args: object) -> None:
        if "controller_lease" in str(clause) and not checked.is_set():
            checked.set()
            go_on.wait(30)

    writer = threading.Thread(target=lambda: fenced.update_job("f2", state="PROVISIONING"))
    writer.start()
    assert checked.wait(30)
    other = make_engine(url)  # another machine's connection
    taken: list[bool] = []
    taker = threading.Thread(
        target=lambda: taken.append(
            ControllerLeases(Ledger(other)).take("f2", "b:9", "b", length_s=30, force=True).taken
        )
    )
    taker.start()
    taker.join(timeout=1.0)
    assert taker.is_alive() and not taken  # held off by the write's check
    go_on.set()
    writer.join(timeout=30)
    taker.join(timeout=30)
    event.remove(ledger.engine, "after_execute", _pause)
    other.dispose()
    assert taken == [True]
    assert ledger.get_job("f2").state == "PROVISIONING"  # the write went in whole, before it
    with pytest.raises(LeaseLost):  # and the next one is refused
        fenced.update_job("f2", state="SYNCING")
    assert ledger.get_job("f2").state == "PROVISIONING"


@pytest.fixture
def settings(tmp_path: Path, url: str) -> Settings:
    return load_settings(
        {"ORCH_HOME": str(tmp_path / "orch"), "ORCH_DATABASE_URL": url,
         "ORCH_LOCAL_ROOT": str(tmp_path / "cloud"), "ORCH_LOCAL_NETWORK": "loopback",
         "ORCH_CONTROLLER_LEASE": "30", "ORCH_LEASE_RENEWAL": "10"}
    )  # fmt: skip


def test_a_controller_whose_lease_was_taken_ends_no_node_and_changes_nothing(
    tmp_path: Path, settings: Settings, ledger: Ledger
) -> None:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: fenced\nworkdir: work\nrun: sleep 600\nresources: {nodes: 1}\n")
    loaded = load_job(spec, {})
    job = register_job(settings, ledger, loaded, "local", "fenced-000001")
    lost: list[str] = []
    keeper = LeaseKeeper(settings, ledger, job.id, on_lost=lost.append)
    assert keeper.take().taken
    provider = LocalProvider(settings)
    runner = JobRunner(
        job, loaded, settings=settings, ledger=keeper.fenced(), provider=provider,
        options=RunnerOptions(connect_timeout=5),
    )  # fmt: skip
    try:
        runner.bring_up.provision()  # real nodes, their leases open, while the lease is ours
        ids = sorted(runner.attempt.ids())
        assert len(ids) == 1 and all(processes_with_marker(i) for i in ids)

        # `orch cancel --force` on another machine takes the lease
        assert ControllerLeases(ledger).take(job.id, "b:9", "b", length_s=30, force=True).taken
        before = snapshot(ledger, job.id)
        with pytest.raises(LeaseLost):
            runner.nodes.terminate_these(ids, known=runner.attempt.instances)
        with pytest.raises(LeaseLost):
            runner._teardown(StopOrder(JobState.CANCELLED, 130, "cancelled"))
        assert [i.instance_id for i in provider.list_owned(job_id=job.id)] == ids
        assert all(processes_with_marker(i) for i in ids)
        after = snapshot(ledger, job.id)
        assert after[0] == before[0] and after[2:] == before[2:]  # the job, leases, records
        assert after[1][len(before[1]) :] == [(LEASE_LOST, after[1][-1][1])]  # said once
        assert "held by b:9 (machine b) now" in after[1][-1][1]
        assert "about to end 1 node(s)" in lost[0]
    finally:
        runner.attempt.close()
        provider.terminate(sorted(i.instance_id for i in provider.list_owned(job_id=job.id)))


def trainers(job_id: str) -> list[int]:
    """Pids of the job's run (torchrun and the step counter) on its local nodes."""
    found = []
    for pid in processes_with_marker("step_counter.py"):
        with contextlib.suppress(OSError):  # it may end as it is read
            if job_id.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
    return found


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_paused_controller_whose_lease_was_taken_over_changes_nothing_once_it_resumes(
    shared: Shared,
) -> None:
    """A laptop that slept: its controller (a real process, paused with SIGSTOP) wakes up
    (SIGCONT) long after its lease ran out and another machine took it over, with its next
    renewal still far off; the run finished meanwhile, which it would end the job for."""
    a, b = shared.a, shared.b
    a.env.update(ORCH_CONTROLLER_LEASE="120", ORCH_LEASE_RENEWAL="60")  # renewals far apart
    job_id = detach(a, shared.spec)
    wait_for_state(shared, job_id, "RUNNING")
    nodes = open_instances(shared, job_id)
    pid = a.controller_pid(job_id)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: not trainers(job_id), "the run to finish", 60, interval=0.2)
        age_lease(shared.ledger, job_id, 121, length_s=120)  # it ran out as a slept
        claim = ControllerLeases(shared.ledger).take(job_id, f"{b.id}:99", b.id, length_s=600)
        assert claim.taken and claim.previous is not None
        before = snapshot(shared.ledger, job_id)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: gone(pid), "the woken controller to stop", 30, interval=0.2)
    after = snapshot(shared.ledger, job_id)
    assert after[0] == before[0] and after[2:] == before[2:]  # no state, lease or record
    new_events = after[1][len(before[1]) :]
    assert [kind for kind, _ in new_events] == [LEASE_LOST], new_events
    assert f"held by {b.id}:99 (machine {b.id}) now" in new_events[0][1]
    assert state(shared, job_id) == "RUNNING" and open_instances(shared, job_id) == nodes
    assert_nodes_alive(nodes)  # no node ended
    log = (a.home / "jobs" / job_id / "controller.log").read_text()
    assert "stopped driving the job" in log
