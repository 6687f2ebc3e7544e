"""The pure parts of bench/dashboard_pages.py: what it asks the dashboard for, how its summary
is read back, and the seeded running jobs' GPU readings and progress it draws."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

from bench.dashboard_pages import Measured, page_row, pages_of, verdicts
from bench.figures import parse_team_scale
from bench.team_seed import GPU_SAMPLE_EVERY_S, LIVE_JOBS, seed_rows

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_running_jobs_have_gpu_readings_and_progress_up_to_now() -> None:
    seed = seed_rows(400, NOW)
    live = {job["id"]: job for job in seed.jobs if job["state"] == "RUNNING"}
    assert len(live) == LIVE_JOBS
    readings = Counter(sample["job_id"] for sample in seed.gpu_samples)
    progress = Counter(sample["job_id"] for sample in seed.progress_samples)
    assert set(readings) == set(live) == set(progress)  # only running jobs have them
    for job_id, job in live.items():
        per_gpu = int(job["step"] // GPU_SAMPLE_EVERY_S)  # its run so far: `step` seconds
        assert readings[job_id] == per_gpu * job["nodes"] * job["gpus_per_node"]
        rows = [s for s in seed.progress_samples if s["job_id"] == job_id]
        steps = [row["step"] for row in rows]
        assert steps == sorted(set(steps)) and steps[-1] == job["step"]
        assert all(job["started_at"] < row["at"] <= NOW for row in rows)
    for sample in seed.gpu_samples:
        assert 0 < sample["mem_used_mib"] < sample["mem_total_mib"] and sample["ok"]
    assert all(job["owner"] for job in seed.jobs)


def test_the_pages_are_the_busiest_running_job_and_a_filter_that_matches() -> None:
    seed = seed_rows(500, NOW)
    pages = pages_of(seed)
    readings = Counter(sample["job_id"] for sample in seed.gpu_samples)
    busiest = max(sorted(readings), key=lambda job_id: readings[job_id])
    paths = [page.path for page in pages]
    assert f"/jobs/{busiest}" in paths and f"/jobs/{busiest}/live" in paths
    assert {
        f"/jobs/{busiest}/charts/{p}.svg" for p in ("gpu", "memory", "progress", "spend")
    } < set(paths)
    assert {"/", "/clusters", "/cost", "/cost/charts/daily.svg", "/cost/charts/burndown.svg"} < set(
        paths
    )
    query = parse_qs(urlsplit(next(p for p in paths if p.startswith("/?"))).query)
    matching = [
        job
        for job in seed.jobs
        if job["state"] == query["state"][0]
        and job["owner"] == query["owner"][0]
        and query["name"][0] in job["name"]
    ]
    assert matching  # the filtered page lists jobs
    assert [page.path for page in pages if page.targeted] == paths[:4]


def test_the_summary_rows_are_read_back_with_their_target() -> None:
    seed = seed_rows(200, NOW - timedelta(days=1))
    pages = pages_of(seed)
    seconds: dict[str, float | None] = {page.label: 0.012 for page in pages}
    seconds[pages[1].label] = 0.31  # the filtered jobs page misses
    seconds[pages[5].label] = None  # the cost page did not answer
    notes = {page.label: "" for page in pages} | {pages[5].label: "answered 500: boom"}
    lines, ok = verdicts("sqlite", 200, Measured(0.5, 0.004, seconds, notes, 0), pages)
    assert not ok
    figures = parse_team_scale("\n".join(lines))
    assert len(figures) == len(pages) - 1  # the unanswered page is a note, not a figure
    jobs, filtered = figures[0], figures[1]
    assert (jobs.value, jobs.baseline, jobs.met) == (0.012, 0.004, True)
    assert (filtered.value, filtered.met) == (0.31, False)
    assert any("not measured: answered 500: boom" in line for line in lines)
    assert "0.0120 s" in page_row("x", 0.012, 0.004, "-", None)
    _, fine = verdicts("sqlite", 200, Measured(0.5, 0.004, dict.fromkeys(seconds, 0.1), notes, 0),
                       pages)  # fmt: skip
    assert fine
