"""Commands started at once on a fresh ORCH_HOME all open the ledger: the first to create its
tables does not fail the others (a real race of processes on one new SQLite file)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from orchestrator.ledger.migrate import create_sqlite
from orchestrator.ledger.store import Ledger, make_engine

OPENERS = 6
FRESH_LEDGERS = 4


def _open(path: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    Ledger(make_engine(path)).ledger_id  # noqa: B018 - reading it writes the ledger's id


def test_processes_opening_a_new_ledger_at_once_all_succeed(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for attempt in range(FRESH_LEDGERS):
        path = str(tmp_path / f"home-{attempt}" / "orch.db")
        barrier = context.Barrier(OPENERS)
        openers = [context.Process(target=_open, args=(path, barrier)) for _ in range(OPENERS)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(60)
        assert [opener.exitcode for opener in openers] == [0] * OPENERS
        ids = {Ledger(make_engine(path)).ledger_id}
        assert len(ids) == 1


def test_a_new_ledger_arrives_in_wal_mode_so_no_opener_has_to_switch_it(tmp_path: Path) -> None:
    """The switch to WAL needs the file to itself: SQLite answers "database is locked" at once
    to a command that tries while another opens it. The file is put in place in WAL mode."""
    path = tmp_path / "orch.db"
    create_sqlite(path, lock_file=tmp_path / "orch.db.lock")
    header = path.read_bytes()[:20]
    assert header[18:20] == b"\x02\x02"  # the write and read versions of a WAL database
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orch.db", "orch.db.lock"]
