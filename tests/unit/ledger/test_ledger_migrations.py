"""The ledger's schema is kept by Alembic revisions (`orchestrator.ledger.migrate`): a new
ledger gets them all, a ledger made before migrations is adopted in place with its rows, one at
head opens with a single query, one from a newer orch is refused; and where the ledger lives
(`ledger.url` / ORCH_DATABASE_URL) is checked before anything is opened. The same on
PostgreSQL: tests/integration/test_ledger_postgres.py."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from orchestrator.cli import context
from orchestrator.config import Settings, load_settings
from orchestrator.errors import ConfigError
from orchestrator.ledger.database import LedgerTooNew, LedgerUrlError, database_url
from orchestrator.ledger.migrate import alembic_config
from orchestrator.ledger.migrations import BASELINE, HEAD
from orchestrator.ledger.migrations.baseline import baseline_metadata
from orchestrator.ledger.store import Ledger, SQLModel, ledger_engine, make_engine

REPO = Path(__file__).resolve().parents[3]


def schema_differences(engine: object) -> list:
    """What Alembic's autogenerate finds between the ledger's tables and the models."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with engine.connect() as connection:  # type: ignore[attr-defined]
        migration = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(migration, SQLModel.metadata)


def test_head_is_the_newest_script_and_the_baseline_its_root() -> None:
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config(None))  # type: ignore[arg-type]
    assert scripts.get_current_head() == HEAD, "a new revision: set migrations.HEAD to it"
    assert [script.revision for script in scripts.walk_revisions()][-1] == BASELINE


def test_a_new_ledger_is_migrated_to_the_models_schema(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "orch.db")
    assert schema_differences(engine) == [], "the models and the revisions differ"
    engine.dispose()


# --- a ledger made before migrations ----------------------------------------------------------

LEGACY_JOB = (
    "INSERT INTO job (id, name, state, provider, nodes, gpus_per_node, spec_json, spec_path,"
    " created_at, started_at, ended_at, step, loss, exit_code, reason, recoveries, policy_state,"
    " controller, stop_state, identity) VALUES ('old-1', 'old', 'SUCCEEDED', 'local', 2, 1,"
    " '{}', 'job.yaml', '2026-01-01T00:00:00.250000+00:00', '2026-01-01T00:01:00+00:00',"
    " '2026-01-01T01:00:00+00:00', 480, 0.125, 0, NULL, 1, NULL, NULL, NULL, NULL)"
)


def legacy_ledger(path: Path) -> None:
    """A ledger as an orch before migrations left it: its tables from create_all, without
    the newer `job.switches`, `job.cluster_id`, `lease.identity`, the progress history and the
    kept clusters, its schema digest in ledger_meta, no alembic_version; and rows in it."""
    engine = create_engine(f"sqlite:///{path}")
    baseline_metadata().create_all(engine)
    engine.dispose()
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX ix_job_cluster_id")
        for table, column in (("job", "switches"), ("job", "cluster_id"), ("lease", "identity")):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        for table in ("progress_sample", "idle_lease", "kept_cluster"):
            db.execute(f"DROP TABLE {table}")
        db.execute("INSERT INTO ledger_meta VALUES ('schema', '0123abcd'), ('ledger_id', 'feed')")
        db.execute(LEGACY_JOB)
        db.execute(
            "INSERT INTO lease (job_id, cluster, provider, instance_id, rank, market,"
            " instance_type, price_per_hour, launched_at, ended_at) VALUES ('old-1', 'old-1',"
            " 'local', 'i-0', 0, 'spot', 'local-1x', '0.360', '2026-01-01T00:00:30+00:00',"
            " '2026-01-01T01:00:30+00:00')"
        )
        db.execute(
            "INSERT INTO event (job_id, at, kind, message, step) VALUES"
            " ('old-1', '2026-01-01T00:00:00+00:00', 'SUCCEEDED', 'done', 480)"
        )
        db.execute(
            "INSERT INTO checkpoint (job_id, name, step, size_bytes, pulled_at, in_mirror)"
            " VALUES ('old-1', 'step-000480', 480, 3, '2026-01-01T00:59:00+00:00', 1)"
        )


def test_an_old_ledger_is_migrated_in_place_with_its_rows_intact(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    legacy_ledger(path)
    engine = make_engine(path)
    ledger = Ledger(engine)
    job = ledger.get_job("old-1")
    assert (job.step, job.loss, job.recoveries, job.switches, job.cluster_id) == (
        480, 0.125, 1, 0, None,
    )  # fmt: skip
    assert job.created_at.isoformat() == "2026-01-01T00:00:00.250000+00:00"
    (lease,) = ledger.leases("old-1")
    assert str(lease.price_per_hour) == "0.360" and lease.identity is None
    assert ledger.spend("old-1") == Decimal("0.360")  # one hour, exactly
    assert [e.kind for e in ledger.events("old-1")] == ["SUCCEEDED"]
    assert [c.name for c in ledger.checkpoints("old-1")] == ["step-000480"]
    assert ledger.ledger_id == "feed"  # the nodes it tagged are still its own
    ledger.update_job("old-1", switches=2, cluster_id="dev-1")  # the new columns work
    assert ledger.get_job("old-1").switches == 2
    assert ledger.progress_samples("old-1") == []  # and the new tables
    assert schema_differences(engine) == []
    engine.dispose()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
        keys = {row[0] for row in db.execute("SELECT key FROM ledger_meta")}
        assert keys == {"ledger_id"}  # the digest stamp made way for the revision
        indexes = {row[1] for row in db.execute("PRAGMA index_list(job)")}
        assert "ix_job_cluster_id" in indexes


def test_an_upgrade_cut_short_leaves_the_old_ledger_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alembic import command

    path = tmp_path / "orch.db"
    legacy_ledger(path)

    def cut(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed after the tables were widened, before the stamp")

    monkeypatch.setattr(command, "stamp", cut)
    with pytest.raises(RuntimeError, match="killed"):
        make_engine(path)
    with sqlite3.connect(path) as db:  # one transaction, rolled back: DDL included
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        columns = {row[1] for row in db.execute("PRAGMA table_info(job)")}
    assert "alembic_version" not in tables and "kept_cluster" not in tables
    assert "switches" not in columns
    monkeypatch.undo()
    assert Ledger(make_engine(path)).get_job("old-1").switches == 0  # and the next open does it


def test_the_first_status_of_an_old_ledger_migrates_it_and_lists_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.in_process import isolated_home, run_main

    home = isolated_home(tmp_path, monkeypatch)
    home.mkdir()
    legacy_ledger(home / "orch.db")
    code, out, err = run_main(["status", "--json"])
    assert code == 0, err
    assert [job["id"] for job in json.loads(out)["jobs"]] == ["old-1"]


def test_a_ledger_at_head_opens_with_one_query_and_without_alembic(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    make_engine(path).dispose()
    code = (
        "import sys\nfrom sqlalchemy import event\nfrom sqlalchemy.engine import Engine\n"
        "from orchestrator.ledger import store\n"
        "queries = []\n"
        "event.listen(Engine, 'before_cursor_execute', lambda *a: queries.append(a[2]))\n"
        "store.make_engine(sys.argv[1])\n"
        "print([q for q in queries if not q.startswith('PRAGMA')], 'alembic' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.stdout.strip() == "['SELECT version_num FROM alembic_version'] False", done.stderr


def test_a_new_sqlite_ledger_appears_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.ledger import migrate

    path = tmp_path / "orch.db"
    (tmp_path / ".orch.db.new-1").write_bytes(b"left by a builder killed before")

    def killed(connection: object) -> None:
        raise KeyboardInterrupt  # as if the process died while the tables were being made

    monkeypatch.setattr(migrate, "_upgrade", killed)
    with pytest.raises(KeyboardInterrupt):
        make_engine(path)
    assert not path.exists()  # no ledger rather than a ledger without tables
    monkeypatch.undo()
    make_engine(path).dispose()
    assert path.exists() and not list(tmp_path.glob(".orch.db.new-*"))


def test_a_ledger_from_a_newer_orch_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    make_engine(path).dispose()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    before = path.read_bytes()
    with pytest.raises(LedgerTooNew) as info:
        make_engine(path)
    assert "9999" in str(info.value) and "upgrade orch" in str(info.value)
    assert path.read_bytes() == before


# --- where the ledger lives -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("postgresql+psycopg://orch@db:5432/orch", "postgresql+psycopg://orch@db:5432/orch"),
        ("postgresql://orch@db/orch", "postgresql+psycopg://orch@db/orch"),
        ("postgres://orch:pw@db/orch", "postgresql+psycopg://orch:***@db/orch"),
        ("sqlite:////srv/orch/ledger.db", "sqlite:////srv/orch/ledger.db"),
    ],
)
def test_a_ledger_url_is_read_as_psycopg_3_or_sqlite(raw: str, expected: str) -> None:
    assert database_url(raw).render_as_string(hide_password=True) == expected


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("mysql://orch:hunter2@db/orch", "PostgreSQL or SQLite"),
        ("postgresql+psycopg2://orch:hunter2@db/orch", "psycopg 3"),
        ("postgresql+psycopg:///orch", "names no server"),
        ("db.example.com:5432/orch", "not a database URL"),
    ],
)
def test_a_ledger_url_the_ledger_cannot_use_is_refused_with_the_fix(raw: str, says: str) -> None:
    with pytest.raises(LedgerUrlError) as info:
        make_engine(raw) if "://" in raw else database_url(raw)
    message = str(info.value)
    assert says in message and "hunter2" not in message
    assert info.value.exit_code == 2 and info.value.hint


def test_orch_database_url_and_config_yaml_name_the_ledger(tmp_path: Path) -> None:
    url = "postgresql+psycopg://orch@127.0.0.1:5432/orch"
    settings = load_settings({"ORCH_HOME": str(tmp_path), "ORCH_DATABASE_URL": url})
    assert settings.ledger.url == url
    (tmp_path / "config.yaml").write_text("ledger: {url: ' postgres://orch@db/orch '}\n")
    assert load_settings({"ORCH_HOME": str(tmp_path)}).ledger.url == "postgres://orch@db/orch"
    for wrong in ("mysql://x:hunter2@y/z", "db.example.com/orch"):
        with pytest.raises(
            ConfigError, match="ledger.url: .*not a PostgreSQL or SQLite URL"
        ) as info:
            load_settings({"ORCH_HOME": str(tmp_path), "ORCH_DATABASE_URL": wrong})
        assert "hunter2" not in str(info.value) and info.value.exit_code == 2


def test_without_a_url_the_ledger_is_the_sqlite_file_under_orch_home(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    engine = ledger_engine(settings)
    assert engine.url.database == str(settings.db_path) and settings.db_path.exists()
    engine.dispose()
    other = tmp_path / "elsewhere" / "ledger.db"
    engine = ledger_engine(Settings(home=tmp_path, ledger={"url": f"sqlite:///{other}"}))
    assert engine.url.database == str(other) and other.exists()
    engine.dispose()


def test_the_list_views_read_the_ledger_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read model reads the ledger `ledger.url` names (ORCH_DATABASE_URL or config.yaml),
    never ORCH_HOME's file then; it steps aside (None) for one the full path must migrate."""
    from tests.support.in_process import isolated_home
    from tests.support.ledger_rows import add_job

    home = isolated_home(tmp_path, monkeypatch)
    add_job(Ledger(make_engine(home / "orch.db")), "here", "SUCCEEDED", 0)
    add_job(Ledger(make_engine(tmp_path / "other.db")), "there", "SUCCEEDED", 0)
    view = context.ledger_view()
    assert view is not None
    with view:
        assert [job.id for job in view.jobs()] == ["here"]
    monkeypatch.setenv("ORCH_DATABASE_URL", f"sqlite:///{tmp_path / 'other.db'}")
    with context.ledger_view() as view:  # type: ignore[union-attr]
        assert [job.id for job in view.jobs()] == ["there"]
    monkeypatch.delenv("ORCH_DATABASE_URL")
    (home / "config.yaml").write_text(f"ledger:\n  url: sqlite:///{tmp_path / 'other.db'}\n")
    with context.ledger_view() as view:  # type: ignore[union-attr]
        assert [job.id for job in view.jobs()] == ["there"]
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (BASELINE,))
    assert context.ledger_view() is None
