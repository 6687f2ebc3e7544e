"""A page of `orch status` and `orch cost` for scripts (`--limit N`, `--since WHEN`), and the
list views' reads: a bounded number of statements whatever the number of jobs."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.team_seed import seed_rows, write_seed
from orchestrator.cli import context
from orchestrator.ledger.store import Ledger, make_engine
from tests.support.in_process import isolated_home, run_main
from tests.unit.cli.test_list_limits import FINISHED, T0, many  # noqa: F401  (the fixture)

NEWEST = [f"job-{n:03d}" for n in range(FINISHED, -1, -1)]  # every job of `many`, newest first


def _ids(args: list[str]) -> list[str]:
    code, out, err = run_main(args)
    assert code == 0, err
    return [job["id"] for job in json.loads(out)["jobs"]]


@pytest.fixture(params=["view", "full"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Through the read-only view, or the full path (settings and migration check first)."""
    if request.param == "full":
        monkeypatch.setattr(context, "ledger_view", lambda: None)
    return request.param


@pytest.mark.usefixtures("many", "path")
def test_status_limit_lists_the_newest_n_jobs_and_no_other() -> None:
    assert _ids(["status", "--json", "--limit", "3"]) == NEWEST[:3]
    code, out, err = run_main(["status", "--limit", "3"])
    assert code == 0, err
    assert "53 more job(s) not listed" in out and "job-000" not in out


@pytest.mark.usefixtures("many", "path")
def test_status_since_lists_the_jobs_created_since_then() -> None:
    since = (T0 + timedelta(hours=50)).isoformat()  # job-051 (created at T0 + 50 h) and after
    assert _ids(["status", "--json", "--since", since]) == NEWEST[:5]
    assert _ids(["status", "--json", "--since", since, "--limit", "2"]) == NEWEST[:2]
    assert _ids(["status", "--json", "--since", "2999-01-01T00:00:00Z"]) == []


@pytest.mark.usefixtures("many", "path")
def test_cost_pages_its_rows_and_keeps_the_whole_total() -> None:
    code, out, err = run_main(["cost", "--json"])
    assert code == 0, err
    whole = json.loads(out)
    code, out, err = run_main(["cost", "--json", "--limit", "2"])
    assert code == 0, err
    page = json.loads(out)
    assert page["jobs"] == whole["jobs"][:2]
    assert page["total_usd"] == whole["total_usd"]
    since = (T0 + timedelta(hours=50)).isoformat()
    assert _ids(["cost", "--json", "--since", since]) == NEWEST[:5]


@pytest.mark.usefixtures("many")
@pytest.mark.parametrize(
    "args",
    [
        ["status", "--limit", "0"],
        ["status", "--limit", "x"],
        ["status", "--since", "yesterday"],
        ["status", "job-001", "--limit", "2"],
        ["cost", "--job", "job-001", "--since", "2h"],
    ],
)
def test_a_page_that_cannot_be_read_is_refused(args: list[str]) -> None:
    code, _, _ = run_main(args)
    assert code != 0


# --- a bounded number of statements ---------------------------------------------------------


def _seeded(home: Path, count: int) -> None:
    """`count` jobs (bench/team_seed.py's mix), every tenth of them left unfinished."""
    rows = seed_rows(count, datetime.now(UTC))
    for job in rows.jobs[::10]:
        job.update(state="RUNNING", ended_at=None, exit_code=None)
    engine = make_engine(home / "orch.db")
    write_seed(engine, rows)
    Ledger(engine).engine.dispose()


def _statements(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> int:
    """How many SQL statements every sqlite3 connection runs for `orch args` (the view's and
    SQLAlchemy's alike: both connect through `sqlite3.connect`)."""
    seen: list[str] = []
    real: Callable[..., sqlite3.Connection] = sqlite3.connect

    def connect(*a: object, **k: object) -> sqlite3.Connection:
        connection = real(*a, **k)  # type: ignore[arg-type]
        connection.set_trace_callback(seen.append)
        return connection

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect)
        patch.setattr(sqlite3.dbapi2, "connect", connect)  # SQLAlchemy's pysqlite
        code, _, err = run_main(args)
    assert code == 0, err
    return len(seen)


LISTINGS = (["status", "--json"], ["status"], ["cost", "--json"], ["cost"])


@pytest.mark.usefixtures("path")
def test_a_listing_reads_in_a_bounded_number_of_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: dict[int, list[int]] = {}
    for count in (50, 500):
        home = isolated_home(tmp_path / str(count), monkeypatch)
        _seeded(home, count)
        counts[count] = [_statements(monkeypatch, args) for args in LISTINGS]
    assert counts[50] == counts[500], f"statements of {LISTINGS} for 50 and 500 jobs: {counts}"
    assert min(counts[500]) > 0 and max(counts[500]) <= 40, counts
