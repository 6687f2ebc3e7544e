"""A ledger that refuses writes never keeps a job's nodes from ending, a controller's that
fences its writes with its lease (on a shared ledger) included.

The ledger is a real SQLite file; a second connection holds an EXCLUSIVE lock on it for longer
than the ledger's busy timeout (cut to a fraction of a second here, 30 s in orch), so every
write fails with "database is locked" while reads still work (WAL). The nodes are real local
sshd nodes. Once the lock is released, `orch reconcile`'s first step writes what the stop
could not: the leases closed at the provider's end time, the job's final state.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import event

from orchestrator.config import LocalSettings, Settings
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.process.controllers import register_job
from orchestrator.control.run.end_nodes import end_nodes, lease_unrecorded
from orchestrator.control.run.runner import JobRunner, RunnerOptions
from orchestrator.control.run.unrecorded import UNRECORDED_DIR, finish_unrecorded
from orchestrator.errors import LedgerError
from orchestrator.job_state import JobState
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.fencing import Fence
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity
from orchestrator.spec.loading import load_job
from tests.support.helpers import processes_with_marker


def quick_ledger(path: Path) -> Ledger:
    """orch's own engine, with a busy timeout of 0.2 s instead of 30 s."""
    engine = make_engine(path)

    @event.listens_for(engine, "connect")
    def _short_timeout(dbapi_conn: object, _record: object) -> None:
        dbapi_conn.execute("PRAGMA busy_timeout=200")  # type: ignore[attr-defined]

    engine.dispose()  # pooled connections were made with the long timeout
    return Ledger(engine)


@contextmanager
def writes_refused(path: Path) -> Iterator[None]:
    """Another process's transaction holds the ledger's write lock until the block ends."""
    holder = sqlite3.connect(path, timeout=5, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "orch", local=LocalSettings(network="loopback"))


def spec_file(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: refused\nworkdir: work\nrun: sleep 600\nresources: {nodes: 2, gpus_per_node: 1}\n"
    )
    return spec


@pytest.mark.parametrize("fenced", [False, True], ids=["own", "fenced"])
def test_a_teardown_with_a_locked_ledger_ends_every_node(
    tmp_path: Path, settings: Settings, fenced: bool
) -> None:
    ledger = quick_ledger(settings.db_path)
    provider = LocalProvider(settings)
    loaded = load_job(spec_file(tmp_path), {})
    job = register_job(settings, ledger, loaded, "local", "refused-000001")
    driving = ledger
    if fenced:  # a controller on a shared ledger: its lease cannot be checked either
        claim = ControllerLeases(ledger).take(job.id, "a:1", "a", length_s=30)
        assert claim.lease is not None
        driving = ledger.fenced(Fence(job.id, "a:1", claim.lease.taken_at, 30))
    lines: list[str] = []

    class Lines:
        def phase(self, text: str) -> None:
            pass

        def metrics(self, metrics: object) -> None:
            pass

        def line(self, text: str) -> None:
            lines.append(text)

    runner = JobRunner(
        job, loaded, settings=settings, ledger=driving, provider=provider,
        reporter=Lines(), options=RunnerOptions(connect_timeout=5),
    )  # fmt: skip
    try:
        runner.bring_up.provision()  # real nodes, leases open
        ids = sorted(runner.attempt.ids())
        assert len(ids) == 2 and all(processes_with_marker(i) for i in ids)
        with writes_refused(settings.db_path):
            runner._teardown(StopOrder(JobState.CANCELLED, 130, "cancelled"))
            assert provider.list_owned(job_id=job.id) == []
            assert all(processes_with_marker(i) == [] for i in ids)
            # nothing could be written: the job still looks alive, its leases open
            assert ledger.get_job(job.id).state == JobState.PROVISIONING
            assert all(lease.ended_at is None for lease in ledger.leases(job.id))
        assert any("ledger refused a write" in line for line in lines), lines
        assert any("orch reconcile" in line for line in lines), lines
        saved = list((settings.home / UNRECORDED_DIR).glob("*.json"))
        assert len(saved) == 1

        assert finish_unrecorded(settings.home, ledger) == [job.id]
        finished = ledger.get_job(job.id)
        assert finished.state == JobState.CANCELLED and finished.exit_code == 130
        leases = ledger.leases(job.id)
        assert {lease.instance_id for lease in leases} == set(ids)
        assert {lease.ended_at for lease in leases} == {finished.ended_at}
        assert not saved[0].exists()
    finally:
        provider.terminate([n.instance_id for n in provider.list_owned()])


def test_orch_down_with_a_locked_ledger_ends_the_nodes_then_says_so(
    tmp_path: Path, settings: Settings
) -> None:
    ledger = quick_ledger(settings.db_path)
    provider = LocalProvider(settings)
    job = register_job(settings, ledger, load_job(spec_file(tmp_path), {}), "local", "down-01")
    key = ensure_identity(settings.keys_dir(job.id), "test").public_key
    nodes = provider.launch(
        LaunchRequest(job_id=job.id, cluster=job.id, count=2, gpus_per_node=1, public_key=key)
    )
    ids = sorted(n.instance_id for n in nodes)
    try:
        assert lease_unrecorded(ledger, provider, job.id, ids) == ids
        with writes_refused(settings.db_path), pytest.raises(LedgerError) as refused:
            end_nodes(ledger, provider, job.id, ids, home=settings.home)
        assert provider.list_owned() == []
        assert all(processes_with_marker(i) == [] for i in ids)
        assert "orch reconcile" in str(refused.value)
        assert all(lease.ended_at is None for lease in ledger.leases(job.id))

        assert finish_unrecorded(settings.home, ledger) == [job.id]
        ended = {lease.ended_at for lease in ledger.leases(job.id)}
        assert len(ended) == 1 and None not in ended
        assert ended.pop().isoformat() in str(refused.value)  # the provider's end time
    finally:
        provider.terminate([n.instance_id for n in provider.list_owned()])
