"""Rank 0's progress history: the journal writes one ledger row per watch check whose step
moved, and an older ledger gains the table on open."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import SilentReporter
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.node.progress import Metrics, parse_metrics


def new_job(ledger: Ledger) -> Job:
    return ledger.add_job(
        Job(
            id="p-1", name="p", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
    )  # fmt: skip


def test_each_check_whose_step_moved_writes_the_newest_line_once(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    journal = Journal(new_job(ledger), ledger, SilentReporter())
    journal.sample_progress()  # a check before any progress line: nothing to keep
    assert ledger.progress_samples("p-1") == []
    # One check read three lines: the last of them is what the history keeps.
    for line in (
        '{"step": 4, "loss": 2.3, "img_s": 100.0}',
        '{"step": 8, "loss": 2.1, "img_s": 110.0}',
        '{"step": 12, "epoch": 0.5, "loss": 1.9, "lr": 0.01, "img_s": 120.5}',
    ):
        metrics = parse_metrics(line)
        assert metrics is not None
        journal.progress(metrics)
    journal.sample_progress()
    journal.sample_progress()  # the next check read nothing new: no second row
    journal.progress(Metrics(step=16))  # no loss, no throughput reported
    journal.sample_progress()
    rows = ledger.progress_samples("p-1")
    assert [(r.step, r.epoch, r.loss, r.lr, r.img_s) for r in rows] == [
        (12, 0.5, 1.9, 0.01, 120.5),
        (16, None, None, None, None),
    ]
    assert rows[0].at <= rows[1].at and rows[0].at.tzinfo is not None
    # A resumed run starts again at an earlier step: the history shows the step going back.
    journal.progress(Metrics(step=12, loss=1.95))
    journal.sample_progress()
    assert [r.step for r in ledger.progress_samples("p-1")] == [12, 16, 12]


def test_an_older_ledger_gains_the_progress_table_on_open(tmp_path: Path) -> None:
    path = tmp_path / "orch.db"
    new_job(Ledger(make_engine(path)))
    with sqlite3.connect(path) as db:  # as left by an orch without a progress history
        db.execute("DROP TABLE progress_sample")
        db.execute("DROP TABLE alembic_version")  # ... from before migrations
    ledger = Ledger(make_engine(path))
    journal = Journal(ledger.get_job("p-1"), ledger, SilentReporter())
    journal.progress(Metrics(step=3, loss=0.7))
    journal.sample_progress()
    assert [(r.step, r.loss) for r in ledger.progress_samples("p-1")] == [(3, 0.7)]
