"""The ledger on PostgreSQL: the same SQLModel code as on SQLite, on a real server
(`postgres_server`, one per session). Every core operation runs on both databases and reads back
the same values (money to the digit, times to the microsecond); a new PostgreSQL ledger is
migrated once however many commands open it at once; and with ORCH_DATABASE_URL the commands
(`orch status`, `orch cost`) read the PostgreSQL ledger and print what they print from SQLite."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.errors import UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger import measures, store
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.database import LedgerUnreachable
from orchestrator.ledger.migrations import HEAD
from orchestrator.ledger.store import (
    CheckpointRecord,
    GpuSampleRecord,
    Job,
    Lease,
    Ledger,
    ProgressSampleRecord,
    make_engine,
)
from orchestrator.report import documents
from tests.support.in_process import isolated_home, run_main
from tests.support.ledger_rows import NOW, fill

T0 = datetime(2026, 3, 1, 12, 0, 0, 123_456, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """A new ledger on each database: the SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        engine = make_engine(tmp_path / "orch.db")
    else:
        engine = make_engine(request.getfixturevalue("postgres_url"))
    yield Ledger(engine)
    engine.dispose()


def new_job(ledger: Ledger, job_id: str, minutes: int = 0, **fields: object) -> Job:
    return ledger.add_job(
        Job(
            id=job_id, name="j", provider="local", nodes=2, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=T0 + timedelta(minutes=minutes), **fields,
        )
    )  # fmt: skip


def new_lease(job_id: str, instance: str, price: str, start: datetime, **fields: object) -> Lease:
    return Lease(
        job_id=job_id, cluster=job_id, provider="local", instance_id=instance, rank=0,
        market="spot", instance_type="local-1x", price_per_hour=Decimal(price),
        launched_at=start, **fields,
    )  # fmt: skip


# --- the core operations, on both databases ------------------------------------------------


def test_jobs_are_written_read_listed_and_updated(any_ledger: Ledger) -> None:
    ledger = any_ledger
    new_job(ledger, "a", 0)
    new_job(ledger, "b", 5, cluster_id=None, policy_state='{"k": 1}')
    assert [job.id for job in ledger.jobs()] == ["b", "a"]  # newest first
    assert [job.id for job in ledger.jobs(limit=1)] == ["b"]
    ledger.update_job("a", state=JobState.RUNNING, step=12, loss=0.25, started_at=T0)
    job = ledger.get_job("a")
    assert (job.state, job.step, job.loss, job.recoveries, job.switches) == (
        "RUNNING", 12, 0.25, 0, 0,
    )  # fmt: skip
    assert job.created_at == T0 and job.created_at.tzinfo is not None
    assert job.started_at == T0 and job.started_at.microsecond == 123_456
    with pytest.raises(UnknownJob):
        ledger.get_job("nope")
    with pytest.raises(UnknownJob):
        ledger.update_job("nope", step=1)


def test_times_of_any_zone_are_kept_as_the_same_instant_in_utc(any_ledger: Ledger) -> None:
    plus_five = timezone(timedelta(hours=5, minutes=30))
    new_job(any_ledger, "tz", started_at=T0.astimezone(plus_five))
    started = any_ledger.get_job("tz").started_at
    assert started == T0 and started is not None and started.utcoffset() == timedelta(0)
    with pytest.raises(Exception, match="aware UTC"):
        new_job(any_ledger, "naive", started_at=datetime(2026, 1, 1))


def test_leases_bill_exactly_the_recorded_prices(any_ledger: Ledger) -> None:
    ledger = any_ledger
    new_job(ledger, "j")
    prices = ["0.36", "1.20", "0.50", "0.123456789012345678901234"]
    for n, price in enumerate(prices):
        ledger.open_lease(new_lease("j", f"i-{n}", price, T0))
    stored = [lease.price_per_hour for lease in ledger.leases("j")]
    assert [str(price) for price in stored] == prices  # the digits and the scale, as given
    assert all(isinstance(price, Decimal) for price in stored)
    assert ledger.close_leases(["i-0", "i-1", "missing"], T0 + timedelta(seconds=100)) == 2
    assert [lease.instance_id for lease in ledger.leases("j", open_only=True)] == ["i-2", "i-3"]
    now = T0 + timedelta(seconds=100)
    expected = sum((Decimal(100) * Decimal(price) / Decimal(3600) for price in prices), Decimal(0))
    assert ledger.spend("j", now) == expected == ledger.spend(now=now)
    assert ledger.leases("j")[0].ended_at == now


def test_events_checkpoints_and_samples(any_ledger: Ledger) -> None:
    ledger = any_ledger
    new_job(ledger, "j")
    for kind in ("PROVISIONING", "LAUNCHED", "STARTED"):
        ledger.add_event("j", kind, f"{kind.lower()} ok", step=None)
    ledger.add_event("j", "CHECKPOINT", step=40)
    events = ledger.events("j")
    assert [e.kind for e in events] == ["PROVISIONING", "LAUNCHED", "STARTED", "CHECKPOINT"]
    assert events[-1].step == 40 and events[-1].message == "" and events[0].at.tzinfo is not None

    big = 5 * 1024**3  # past 2 GiB: a BIGINT on PostgreSQL
    record = ledger.add_checkpoint(
        CheckpointRecord(job_id="j", name="step-000040", step=40, size_bytes=big,
                         pulled_at=T0, kind="step", digest="d40")
    )  # fmt: skip
    assert record.id is not None
    ledger.update_checkpoint(record.id, in_mirror=False, pruned_at=T0 + timedelta(hours=1))
    (read,) = ledger.checkpoints("j")
    assert (read.size_bytes, read.in_mirror, read.pruned_at) == (
        big, False, T0 + timedelta(hours=1),
    )  # fmt: skip
    assert ledger.checkpoints("j", live_only=True) == []

    ledger.add_gpu_samples(
        GpuSampleRecord(job_id="j", rank=rank, gpu=0, at=T0 + timedelta(seconds=s),
                        util_pct=float(s), ok=s < 20)
        for s in (0, 10, 20) for rank in (0, 1)
    )  # fmt: skip
    latest = ledger.latest_gpu_samples("j")
    assert [(r.rank, r.util_pct, r.ok) for r in latest] == [(0, 20.0, False), (1, 20.0, False)]
    assert len(ledger.gpu_samples("j")) == 6
    ledger.add_progress_sample(ProgressSampleRecord(job_id="j", at=T0, step=4, loss=2.5))
    assert [(p.step, p.loss) for p in ledger.progress_samples("j")] == [(4, 2.5)]


def test_kept_clusters_bill_their_idle_leases(any_ledger: Ledger) -> None:
    clusters = Clusters(any_ledger)
    kept = clusters.create(
        "dev", provider="local", nodes=1, gpus_per_node=1, autostop_s=600.0, now=T0
    )
    clusters.release(kept.id, [("i-k", 0, Decimal("0.90"))], T0)
    assert clusters.up("dev") is not None
    assert clusters.idle_cost(kept.id, T0 + timedelta(hours=2)) == Decimal("1.80")
    any_ledger.close_leases(["i-k"], T0 + timedelta(hours=1))
    clusters.down(kept.id, T0 + timedelta(hours=1), "autostop")
    assert clusters.up("dev") is None
    assert clusters.idle_cost(kept.id, T0 + timedelta(hours=5)) == Decimal("0.90")


def test_the_ledger_id_is_made_once_and_kept(any_ledger: Ledger) -> None:
    first = any_ledger.ledger_id
    again = Ledger(make_engine(any_ledger.engine.url.render_as_string(hide_password=False)))
    assert again.ledger_id == first and len(first) == 16
    again.engine.dispose()


def test_a_foreign_key_is_enforced_on_both(any_ledger: Ledger) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        any_ledger.open_lease(new_lease("no-such-job", "i-x", "1", T0))


# --- PostgreSQL only ------------------------------------------------------------------------


def test_a_new_postgresql_ledger_is_migrated_to_the_models_schema(postgres_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = make_engine(postgres_url)
    try:
        with engine.connect() as connection:
            migration = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(migration, store.SQLModel.metadata) == []
            versions = connection.execute(text("SELECT version_num FROM alembic_version")).all()
            assert versions == [(HEAD,)]
    finally:
        engine.dispose()


def test_money_is_numeric_and_times_are_timestamptz_on_postgresql(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as connection:
            kinds = dict(
                connection.execute(
                    text(
                        "SELECT table_name || '.' || column_name, data_type"
                        " FROM information_schema.columns WHERE table_schema = 'public'"
                    )
                ).all()
            )
        assert kinds["lease.price_per_hour"] == "numeric"
        assert kinds["idle_lease.price_per_hour"] == "numeric"
        assert kinds["job.created_at"] == "timestamp with time zone"
        assert kinds["checkpoint.size_bytes"] == "bigint"
        assert kinds["checkpoint.in_mirror"] == "boolean"
    finally:
        engine.dispose()


def _open(
    url: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue
) -> None:
    barrier.wait()
    ledger = Ledger(make_engine(url))
    out.put(ledger.ledger_id)


def test_processes_opening_a_new_postgresql_ledger_at_once_all_succeed(
    postgres_server: object, postgres_url: str
) -> None:
    openers = 4
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(openers), context.Queue()
    processes = [
        context.Process(target=_open, args=(postgres_url, barrier, out)) for _ in range(openers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0] * openers
    ids = {out.get(timeout=5) for _ in range(openers)}
    assert len(ids) == 1
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as connection:
            versions = connection.execute(text("SELECT version_num FROM alembic_version")).all()
        assert versions == [(HEAD,)]
    finally:
        engine.dispose()


def test_an_unreachable_server_is_a_clear_error(postgres_server: object) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LedgerUnreachable) as info:
        make_engine(f"postgresql+psycopg://orch:secret@127.0.0.1:{port}/orch?connect_timeout=3")
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "secret" not in message
    assert "ORCH_DATABASE_URL" in message  # what to fix


# --- the commands -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["status", "--json"], ["status"], ["cost", "--json"], ["cost"], ["cost", "--all"]]
)
def test_orch_database_url_makes_the_commands_read_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str, argv: list[str]
) -> None:
    home = isolated_home(tmp_path, monkeypatch)
    for module in (documents, measures, store):
        monkeypatch.setattr(module, "utcnow", lambda: NOW)
    sqlite = Ledger(make_engine(home / "orch.db"))
    fill(sqlite, tmp_path / "store")
    code, from_sqlite, err = run_main(argv)
    assert code == 0, err
    (home / "orch.db").rename(tmp_path / "elsewhere.db")  # only PostgreSQL is left to read

    postgresql = Ledger(make_engine(postgres_url))
    copy_rows(sqlite, postgresql)  # the very rows: kept clusters' ids are random
    monkeypatch.setenv("ORCH_DATABASE_URL", postgres_url)
    code, from_postgresql, err = run_main(argv)
    assert code == 0, err
    assert from_postgresql == from_sqlite
    assert not (home / "orch.db").exists()  # no SQLite ledger was made on the side
    if argv == ["status", "--json"]:
        assert len(json.loads(from_postgresql)["jobs"]) == 6
    postgresql.engine.dispose()
    sqlite.engine.dispose()


def test_the_engine_view_reads_postgresql_as_the_models_do(
    postgres_url: str, tmp_path: Path
) -> None:
    from orchestrator.ledger.view import LedgerView
    from tests.unit.ledger.test_ledger_view import assert_rows_are_the_models

    ledger = Ledger(make_engine(postgres_url))
    fill(ledger, tmp_path / "store")
    assert_rows_are_the_models(LedgerView.of_engine(ledger.engine), ledger)
    ledger.engine.dispose()


def test_postgresql_sums_each_jobs_bill_as_the_leases_arithmetic_does(postgres_url: str) -> None:
    """`orch cost` on PostgreSQL has the database sum every job's leases (`LedgerView.job_bills`)
    instead of reading each lease: the same counts, node-seconds, open leases and spend as
    `bills_of` over the leases, to far below a cent (odd prices, sub-second spans, a lease still
    open, one whose end came before its start)."""
    from orchestrator.ledger.view import LedgerView, bills_of

    ledger = Ledger(make_engine(postgres_url))
    spans = [
        ("a", "1.36920", 0.0, 9653.671999),
        ("a", "0.00001", 1.5, 1.500001),
        ("a", "32.7726", 10.0, None),
        ("b", "2.5", 100.0, 40.0),  # ended "before" it began: a clock's step, bills nothing
        ("b", "0.3333333", 7.25, 86_400.75),
    ]
    for job_id in ("a", "b", "c"):
        ledger.add_job(
            Job(id=job_id, name=job_id, provider="local", nodes=1, gpus_per_node=1,
                spec_json="{}", spec_path="job.yaml", created_at=T0)
        )  # fmt: skip
    for index, (job_id, price, start, end) in enumerate(spans):
        ledger.open_lease(
            Lease(job_id=job_id, cluster=job_id, provider="local", instance_id=f"n-{index}",
                  rank=index, market="spot", instance_type="local-1x",
                  price_per_hour=Decimal(price), launched_at=T0 + timedelta(seconds=start),
                  ended_at=None if end is None else T0 + timedelta(seconds=end))
        )  # fmt: skip
    now = T0 + timedelta(hours=5, microseconds=7)
    with LedgerView.of_engine(ledger.engine) as view:
        summed = view.job_bills(now)
        expected = bills_of(view.lease_spans(), now)
        heads = view.job_heads()
    ledger.engine.dispose()
    assert set(summed) == set(expected) == {"a", "b"}  # c has no lease, so no bill
    assert sorted(heads) == [("a", "PENDING", "local"), ("b", "PENDING", "local"),
                             ("c", "PENDING", "local")]  # fmt: skip
    for job_id, bill in summed.items():
        want = expected[job_id]
        assert (bill.leases, bill.running) == (want.leases, want.running)
        assert bill.node_seconds == pytest.approx(want.node_seconds, abs=1e-6)
        assert abs(bill.spend - want.spend) < Decimal("1e-12"), (bill.spend, want.spend)
    assert summed["a"].running and not summed["b"].running
    exact_b = Decimal("0.3333333") * Decimal("86393.5") / 3600  # the lease that bills
    assert abs(summed["b"].spend - exact_b) < Decimal("1e-12")


def copy_rows(source: Ledger, target: Ledger) -> None:
    """Every row of every table of `source` into the empty `target`, through the models'
    column types (ids as they are: the target's id sequences are not advanced)."""
    with source.engine.connect() as reading, target.engine.begin() as writing:
        writing.execute(text("DELETE FROM ledger_meta"))
        for table in store.SQLModel.metadata.sorted_tables:
            rows = [dict(row._mapping) for row in reading.execute(table.select())]
            if rows:
                writing.execute(table.insert(), rows)


def test_without_the_server_binaries_the_tests_say_how_to_install_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support import postgres

    monkeypatch.setattr(postgres.glob, "glob", lambda pattern: [])
    with pytest.raises(postgres.PostgresUnavailable, match="apt-get install -y postgresql"):
        postgres.start_server()  # the session fixture fails (never skips) with this message


def test_the_dashboard_finds_jobs_by_state_owner_and_a_literal_part_of_the_name(
    any_ledger: Ledger,
) -> None:
    from orchestrator.ledger.view import LedgerView

    base = datetime(2026, 12, 1, tzinfo=UTC)
    names = [("a1", "llm-sft", "FAILED", "ana"), ("a2", "LLM_sft", "FAILED", "bo"),
             ("a3", "cifar%", "SUCCEEDED", "ana"), ("a4", "llmXsft", "FAILED", "ana")]  # fmt: skip
    for i, (job_id, name, state, owner) in enumerate(names):
        any_ledger.add_job(
            Job(
                id=job_id,
                name=name,
                state=state,
                provider="local",
                nodes=1,
                gpus_per_node=1,
                spec_json="{}",
                spec_path="job.yaml",
                created_at=base + timedelta(minutes=i),
                owner=owner,
            )  # fmt: skip
        )
    with LedgerView.of_engine(any_ledger.engine) as view:
        found, count = view.find_jobs(states=("FAILED",), owner="ana", name_part="LLM", limit=10)
        assert [j.id for j in found] == ["a4", "a1"] and count == 2  # newest first
        # `_` and `%` are taken literally, not as patterns
        assert [j.id for j in view.find_jobs(name_part="m_s", limit=10)[0]] == ["a2"]
        assert [j.id for j in view.find_jobs(name_part="%", limit=10)[0]] == ["a3"]
        found, count = view.find_jobs(limit=2)
        assert [j.id for j in found] == ["a4", "a3"] and count == 4
        assert view.owners() == ["ana", "bo"]
