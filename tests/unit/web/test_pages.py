"""The dashboard's page data that needs no server: filters from a query, ids that may name a
folder, a node log read in bounded pieces, the version that tells a page to redraw."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.errors import UnknownJob
from orchestrator.web.formatting import duration_text, number_text, spend_share, time_text
from orchestrator.web.pages import LOG_CHUNK_BYTES, JobFilter, job_version, log_chunk, safe_job_id


def test_filters_come_from_the_query_bounded_and_an_unknown_state_is_no_filter() -> None:
    assert JobFilter.of({}) == JobFilter() and not JobFilter.of({}).active
    chosen = JobFilter.of({"state": "failed", "owner": " ana ", "name": "llm"})
    assert chosen == JobFilter("FAILED", "ana", "llm") and chosen.active
    assert chosen.query() == {"state": "FAILED", "owner": "ana", "name": "llm"}
    assert JobFilter.of({"state": "EXPLODED"}).state is None
    assert len(JobFilter.of({"name": "x" * 5000}).name or "") == 100


@pytest.mark.parametrize("job_id", ["../etc", "..", ".hidden", "a/b", "a\\b", "", "x" * 200,
                                    "a\x00b", "é"])  # fmt: skip
def test_an_id_that_could_leave_the_jobs_folder_names_no_job(job_id: str) -> None:
    with pytest.raises(UnknownJob):
        safe_job_id(job_id)


def test_ordinary_ids_pass() -> None:
    assert safe_job_id("cifar-ddp-3f9c1a") == "cifar-ddp-3f9c1a"
    assert safe_job_id("seed-000001") == "seed-000001"


def settings_at(home: Path) -> Settings:
    return Settings(home=home)


def test_a_log_is_read_from_its_tail_then_followed_and_restarted_when_rotated(
    tmp_path: Path,
) -> None:
    settings = settings_at(tmp_path)
    logs = settings.job_dir("j1") / "logs"
    logs.mkdir(parents=True)
    path = logs / "node-1.log"
    lines = [f"line {i}\n".encode() for i in range(20000)]
    path.write_bytes(b"".join(lines))
    first = log_chunk(settings, "j1", 1, None)
    assert first is not None and first.offset == path.stat().st_size
    assert len(first.text) <= LOG_CHUNK_BYTES and first.text.startswith("line ")
    assert first.text.endswith("line 19999\n")
    with path.open("ab") as handle:
        handle.write(b"next \xff\n")  # not UTF-8: replaced, never an error
    more = log_chunk(settings, "j1", 1, first.offset)
    assert more is not None and more.text == "next \ufffd\n" and not more.restarted
    path.write_bytes(b"fresh\n")  # rotated: shorter than where the page stood
    again = log_chunk(settings, "j1", 1, more.offset)
    assert again is not None and again.restarted and again.text == "fresh\n"
    assert log_chunk(settings, "j1", 0, None) is None  # no such node log here
    assert log_chunk(settings, "j1", -1, None) is None
    with pytest.raises(UnknownJob):
        log_chunk(settings, "../j1", 1, None)


def test_the_version_moves_with_what_the_charts_draw_not_with_the_spend() -> None:
    base = {"state": "RUNNING", "step": 5, "loss": 0.5, "events": [{}], "checkpoints": [],
            "gpus": [{"at": "t1"}], "spend_usd": 1.0}  # fmt: skip
    assert job_version({**base, "spend_usd": 2.0}) == job_version(base)
    for change in ({"step": 6}, {"gpus": [{"at": "t2"}]}, {"events": [{}, {}]},
                   {"state": "SUCCEEDED"}, {"checkpoints": [{"step": 5}]}):  # fmt: skip
        assert job_version({**base, **change}) != job_version(base)


def test_values_are_written_for_people() -> None:
    assert duration_text(None) == "-" and duration_text(42.7) == "42 s"
    assert duration_text(200) == "3 min 20 s" and duration_text(3900) == "1 h 05 min"
    assert duration_text(90000) == "1 d 1 h"
    assert time_text("2026-12-07T09:30:12.5+00:00") == "2026-12-07 09:30:12 UTC"
    assert time_text(None) == "-"
    assert number_text(0.123456) == "0.1235" and number_text(None) == "-"
    assert spend_share(5.0, 20.0) == 25 and spend_share(50.0, 20.0) == 100
    assert spend_share(1.0, None) is None
