"""The ledger's read-only sqlite3 view (`orchestrator.ledger.view`), which `orch status` and
`orch cost` start with: on one ledger with jobs, leases, checkpoints, kept clusters and idle
leases it gives the same rows and the same documents as SQLModel does, the commands print the
same bytes through it as through the full path, and it steps aside (None) for any ledger the
full path must check or migrate first."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import fields
from pathlib import Path

import pytest

from orchestrator.cli import context
from orchestrator.config import Settings, load_settings
from orchestrator.control.process.controllers import JOB_RECORD, ControllerLock
from orchestrator.ledger import measures, store
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.migrations import HEAD
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.ledger.view import (
    LAYOUT,
    SCHEMA_REVISION,
    LedgerView,
    open_view,
)
from orchestrator.report import documents
from orchestrator.report.clusters import clusters_document, clusters_from
from orchestrator.report.documents import cost_document, cost_from, job_document, jobs_list
from tests.support.in_process import isolated_home, run_main
from tests.support.ledger_rows import NOW, add_recovered_job, fill


@pytest.fixture
def filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, Ledger]:
    home = isolated_home(tmp_path, monkeypatch)
    settings = load_settings()
    assert settings.home == home
    ledger = Ledger(make_engine(settings.db_path))
    fill(ledger, tmp_path / "store")
    for module in (documents, measures, store):
        monkeypatch.setattr(module, "utcnow", lambda: NOW)
    return settings, ledger


def view_of(settings: Settings) -> LedgerView:
    view = open_view(settings.db_path)
    assert view is not None
    return view


# --- the contract ---------------------------------------------------------------------------


def test_the_layout_is_the_models_at_the_newest_revision() -> None:
    models = {
        table.name: tuple(sorted(column.name for column in table.columns))
        for table in store.SQLModel.metadata.sorted_tables
    }
    assert dict(LAYOUT) == models, "a model changed: update ledger.view.LAYOUT"
    assert SCHEMA_REVISION == HEAD  # tests/integration/test_ledger_migrations.py: models = HEAD


@pytest.mark.parametrize("reader", ["sqlite3", "engine"])
def test_rows_have_the_models_values_and_types(
    filled: tuple[Settings, Ledger], reader: str
) -> None:
    settings, ledger = filled
    opened = view_of(settings) if reader == "sqlite3" else LedgerView.of_engine(ledger.engine)
    assert_rows_are_the_models(opened, ledger)


def assert_rows_are_the_models(opened: LedgerView, ledger: Ledger) -> None:
    """Every read of `opened` gives the rows the SQLModel ledger gives, values and types."""
    clusters = Clusters(ledger)
    with opened as view:
        pairs = [
            *zip(view.jobs(), ledger.jobs(), strict=True),
            *((view.get_job(job.id), job) for job in ledger.jobs()),
            *(
                pair
                for job in ledger.jobs()
                for pair in [
                    *zip(view.leases(job.id), ledger.leases(job.id), strict=True),
                    *zip(
                        (span for span in view.lease_spans() if span.job_id == job.id),
                        ledger.leases(job.id),
                        strict=True,
                    ),
                    *zip(view.checkpoints(job.id), ledger.checkpoints(job.id), strict=True),
                ]
            ),
            *zip(view.clusters.all(), clusters.all(), strict=True),
            *(
                pair
                for cluster in clusters.all()
                for pair in [
                    *zip(view.clusters.jobs(cluster.id), clusters.jobs(cluster.id), strict=True),
                    *zip(
                        view.clusters.idle_leases(cluster.id),
                        clusters.idle_leases(cluster.id),
                        strict=True,
                    ),
                ]
            ),
        ]
        assert len(view.checkpoints("done-1", live_only=True)) == 2
        assert [c.id for c in view.clusters.all(up_only=True)] == [
            c.id for c in clusters.all(up_only=True)
        ]
        assert sorted(view.job_states()) == sorted((j.id, j.state) for j in ledger.jobs())
        assert [lease.id for lease in view.leases()] == [lease.id for lease in ledger.leases()]
    assert len(pairs) > 25
    for row, model in pairs:
        for field in fields(row):
            mine, theirs = getattr(row, field.name), getattr(model, field.name)
            assert (mine, type(mine)) == (theirs, type(theirs)), (type(row), field.name)


def test_status_and_cost_documents_are_the_same_from_either_reader(
    filled: tuple[Settings, Ledger],
) -> None:
    settings, ledger = filled
    with view_of(settings) as view:
        listed = jobs_list(view, settings.home, NOW, limit=50)
        up = clusters_from(view, view.clusters, NOW, up_only=True)
        every = clusters_from(view, view.clusters, NOW, up_only=False)
        bill = cost_from(view, view.clusters, NOW)
        one = cost_from(view, view.clusters, NOW, "done-1")
        assert jobs_list(view, settings.home, NOW, limit=2) == listed[:2]
    expected = [job_document(ledger, settings, job, detail=False) for job in ledger.jobs(limit=50)]
    assert json.dumps(listed) == json.dumps(expected)
    assert listed[-1]["checkpoints"][0]["path"] == str(
        settings.job_dir("done-1") / "checkpoints" / "step-000000"
    )
    assert listed[-1]["checkpoints"][1]["files"][0]["url"].startswith("file://")
    assert json.dumps(up) == json.dumps(clusters_document(ledger, NOW, up_only=True))
    assert [c["name"] for c in up] == ["busy", "idle"]
    assert json.dumps(every) == json.dumps(clusters_document(ledger, NOW, up_only=False))
    assert json.dumps(bill) == json.dumps(cost_document(ledger))
    assert bill["total_usd"] > 0 and len(bill["clusters"]) == 3
    assert json.dumps(one) == json.dumps(cost_document(ledger, "done-1"))


def test_one_jobs_document_is_the_same_from_either_reader(
    filled: tuple[Settings, Ledger],
) -> None:
    settings, ledger = filled
    add_recovered_job(ledger, "recovered-1")
    ledger.add_gpu_samples(
        store.GpuSampleRecord(job_id="run-1", rank=rank, gpu=gpu, at=NOW, util_pct=50.0 + n,
                              mem_used_mib=100.0, mem_total_mib=200.0, ok=bool(n % 2))
        for n, (rank, gpu) in enumerate([(0, 0), (0, 1), (1, -1), (0, 0)])
    )  # fmt: skip
    with view_of(settings) as view:
        for job in ledger.jobs():
            mine = job_document(view, settings, view.job_detail(job.id))
            assert json.dumps(mine) == json.dumps(job_document(ledger, settings, job)), job.id
        gpus = view.latest_gpu_samples("run-1")
        samples = zip(gpus, ledger.latest_gpu_samples("run-1"), strict=True)
        events = zip(view.events("recovered-1"), ledger.events("recovered-1"), strict=True)
        for row, model in [*samples, *events]:
            for field in fields(row):
                mine, theirs = getattr(row, field.name), getattr(model, field.name)
                assert (mine, type(mine)) == (theirs, type(theirs)), (type(row), field.name)
    assert len(job_document(ledger, settings, ledger.get_job("run-1"))["gpus"]) == 3


@pytest.mark.parametrize(
    "argv",
    [["status"], ["status", "--json"], ["cost"], ["cost", "--json"], ["cost", "--job", "run-1"],
     ["status", "run-1"], ["status", "run-1", "--json"], ["status", "run-1", "--events", "all"]],
)  # fmt: skip
def test_the_commands_print_the_same_through_the_view_as_through_sqlmodel(
    filled: tuple[Settings, Ledger], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    code, quick, err = run_main(argv)
    assert code == 0, err
    with monkeypatch.context() as patch:
        patch.setattr(context, "ledger_view", lambda: None)
        code, full, err = run_main(argv)
    assert code == 0, err
    assert quick == full
    assert "run-1" in quick


def test_an_unknown_job_is_the_same_error_either_way(
    filled: tuple[Settings, Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    quick = run_main(["cost", "--job", "nobody-1"])
    monkeypatch.setattr(context, "ledger_view", lambda: None)
    assert run_main(["cost", "--job", "nobody-1"]) == quick
    assert quick[0] == 2 and "no job 'nobody-1' in the ledger" in quick[2]


def test_a_cluster_past_its_autostop_takes_the_full_path(
    filled: tuple[Settings, Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, ledger = filled
    clusters = Clusters(ledger)
    (idle,) = [c for c in clusters.all(up_only=True) if c.name == "idle"]
    clusters.update(idle.id, autostop_s=60.0)  # idle since 300 s: long past due at NOW
    settled: list[str] = []
    monkeypatch.setattr(
        "orchestrator.control.run.kept_turn.settle",
        lambda ledger, provider, c: settled.append(c.name),
    )
    code, out, err = run_main(["status", "--json"])
    assert code == 0, err
    assert settled == ["idle"]  # the provider was asked, as before
    assert [c["name"] for c in json.loads(out)["clusters"]] == ["busy", "idle"]


# --- when the view steps aside ---------------------------------------------------------------


def test_an_absent_ledger_reads_empty_and_stays_absent(tmp_path: Path) -> None:
    path = tmp_path / "home" / "orch.db"
    with open_view(path) as view:  # type: ignore[union-attr]
        assert view.jobs() == [] and view.clusters.all() == [] and view.job_states() == []
    assert not path.parent.exists()


def test_a_fresh_home_lists_no_jobs_and_costs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = isolated_home(tmp_path, monkeypatch)
    code, out, err = run_main(["status", "--json"])
    assert (code, json.loads(out)) == (0, {"jobs": [], "clusters": []}), err
    code, out, err = run_main(["cost", "--json"])
    assert (code, json.loads(out)["total_usd"]) == (0, 0.0), err
    Ledger(make_engine(home / "orch.db"))  # brand new: at the newest revision, empty
    assert open_view(home / "orch.db") is not None
    code, out, err = run_main(["status"])
    assert code == 0 and "jobs" in out, err


def test_an_unstamped_or_foreign_file_is_left_to_the_full_path(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:  # a ledger from before migrations
        db.execute("CREATE TABLE job (id TEXT PRIMARY KEY)")
    assert open_view(old) is None
    stale = tmp_path / "stale.db"
    Ledger(make_engine(stale))
    with sqlite3.connect(stale) as db:  # at another revision (an older or a newer orch's)
        db.execute("UPDATE alembic_version SET version_num = 'older'")
    assert open_view(stale) is None
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all, just bytes " * 100)
    assert open_view(junk) is None


def test_a_stale_ledger_is_migrated_by_the_first_status(
    filled: tuple[Settings, Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _ = filled
    with sqlite3.connect(settings.db_path) as db:  # as a ledger made before migrations
        db.execute("DROP TABLE alembic_version")
    assert open_view(settings.db_path) is None
    code, out, err = run_main(["status", "--json"])
    assert code == 0, err
    assert len(json.loads(out)["jobs"]) == 6
    assert open_view(settings.db_path) is not None  # migrated and stamped: the next is quick


def test_the_view_writes_nothing(filled: tuple[Settings, Ledger]) -> None:
    settings, _ = filled
    before = settings.db_path.read_bytes()
    with view_of(settings) as view:
        cost_from(view, view.clusters, NOW)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            view.fetch("DELETE FROM job")
    assert settings.db_path.read_bytes() == before


# --- ORCH_HOME and lost controllers without the settings ------------------------------------


@pytest.mark.parametrize("value", ["/tmp/orch-a", "rel/orch", "~/orch-b", ""])
def test_orch_home_is_the_settings_home(
    value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCH_HOME", value)
    assert context.orch_home() == load_settings().home


def test_a_lost_controller_is_found_without_the_settings(
    filled: tuple[Settings, Ledger],
) -> None:
    settings, _ = filled
    # run-1 is RUNNING and never-1, queued-1 PENDING: none has a record, so none is lost
    assert context.no_controller_lost()
    job_dir = settings.job_dir("run-1")
    job_dir.mkdir(parents=True)
    (job_dir / JOB_RECORD).write_text("{}")
    assert not context.no_controller_lost()  # recorded, and no controller holds its lock
    lock = ControllerLock(settings, "run-1")
    assert lock.acquire()
    try:
        assert context.no_controller_lost()
    finally:
        lock.release()
    done = settings.job_dir("done-1")
    done.mkdir(parents=True)
    (done / JOB_RECORD).write_text("{}")
    (job_dir / JOB_RECORD).unlink()
    assert context.no_controller_lost()  # a final job never needs one, recorded or not


@pytest.mark.parametrize("argv", [["status"], ["cost", "--json"]])
def test_invalid_settings_still_stop_the_list_views(
    filled: tuple[Settings, Ledger], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    settings, _ = filled
    (settings.home / "config.yaml").write_text("local: {network: bridge}\n")
    code, out, err = run_main(argv)
    assert code == 2 and "invalid orch settings: local.network" in err
    (settings.home / "config.yaml").unlink()
    monkeypatch.setenv("ORCH_LOGS_KEEP", "-1")
    code, out, err = run_main(argv)
    assert code == 2 and "invalid orch settings: logs.keep" in err
