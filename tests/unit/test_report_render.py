"""Report pictures and pages drawn from hand-built ledger rows, including the awkward jobs."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest
from PIL import Image

from orchestrator.config import Settings
from orchestrator.report.documents import job_document
from orchestrator.report.render import render_html, render_png
from orchestrator.report.write import report_data, write_report
from tests.unit.test_report_data import at, event, lease, ledger_with, make_job, sample

HOSTILE = "<img src=x onerror=alert(1)> $x$ & 'q' \"dq\""


def png_size(data: bytes) -> tuple[int, int]:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image.size


@pytest.mark.parametrize(
    "rows",
    [
        [],  # failed before anything launched: no readings, nothing billed
        [lease("a", "0.5", 2, None), sample(0, -1, 5, 150.0), sample(0, -1, 6, None, ok=False)],
        [lease("a", "9", 1, 30), sample(0, 0, 5, 90.0), sample(1, -1, 5, 20.0)],
    ],
    ids=["empty", "cpu-only-open-lease", "mixed"],
)
def test_awkward_jobs_still_draw(tmp_path: Path, rows: list[object]) -> None:
    ledger = ledger_with(tmp_path, make_job(max_cost="0.5"), [*rows, event("FAILED", 40, HOSTILE)])
    assert png_size(render_png(report_data(ledger, "rep-1", now=at(60)))) == (1100, 750)


def test_page_escapes_every_ledger_string_and_embeds_the_picture(tmp_path: Path) -> None:
    job = make_job(state="FAILED", ended=at(40))
    job.reason = HOSTILE
    hostile_lease = lease("a", "1", 1, 30)
    hostile_lease.instance_type = HOSTILE
    ledger = ledger_with(tmp_path, job, [hostile_lease, event("WARNING", 20, HOSTILE, step=3)])
    settings = Settings(home=tmp_path / "orch")
    png = render_png(report_data(ledger, "rep-1", now=at(60)))
    page = render_html(job_document(ledger, settings, ledger.get_job("rep-1")), png)
    assert "<img src=x" not in page and "onerror=alert(1)>" not in page
    escaped = "&lt;img src=x onerror=alert(1)&gt; $x$ &amp; &#x27;q&#x27; &quot;dq&quot;"
    assert page.count(escaped) == 3  # reason, lease type, event message
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert embedded is not None and base64.b64decode(embedded.group(1)) == png


def test_write_report_goes_to_the_job_directory_or_out(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, make_job(), [lease("a", "1", 1, 30)])
    settings = Settings(home=tmp_path / "orch")
    result = write_report(settings, ledger, "rep-1", out=None, html=False)
    assert result.path == settings.job_dir("rep-1") / "report.png"
    assert result.path.read_bytes()[:4] == b"\x89PNG"
    page = write_report(settings, ledger, "rep-1", out=tmp_path / "a" / "r.html", html=True)
    assert page.path == tmp_path / "a" / "r.html" and page.format == "html"
    assert page.path.read_text().startswith("<!DOCTYPE html>")
    assert not list((tmp_path / "a").glob(".*.tmp"))  # written through a temp file, renamed
