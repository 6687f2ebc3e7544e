"""Report pictures and pages drawn from hand-built ledger rows, including the awkward jobs."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from PIL import Image

from orchestrator.config import Settings
from orchestrator.ledger.store import Ledger
from orchestrator.report.documents import job_document
from orchestrator.report.render import draw_figure, labelled_checkpoints, render_html, render_png
from orchestrator.report.write import report_data, write_report
from tests.unit.test_report_data import (
    at,
    event,
    lease,
    ledger_with,
    make_job,
    progress,
    sample,
)

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
    assert png_size(render_png(report_data(ledger, "rep-1", now=at(60)))) == (1100, 1100)


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


# --- the figure, through matplotlib's own objects ---------------------------------------------


def panels(figure: Figure) -> dict[str, Axes]:
    """The figure's axes by their y label."""
    return {axes.get_ylabel(): axes for axes in figure.axes if axes.get_ylabel()}


def lines(axes: Axes) -> dict[str, Line2D]:
    return {line.get_label(): line for line in axes.get_lines()}


def texts(figure: Figure) -> list[str]:
    return [t.get_text() for t in figure.findobj(Text) if t.get_text()]


def trained_job(tmp_path: Path, *, checkpoints: int) -> Ledger:
    rows: list[object] = [lease("a", "1", 1, 200), event("RUNNING", 5), event("SUCCEEDED", 190)]
    rows += [progress(10 + 10 * i, 4 * (i + 1), 2.5 - 0.1 * i, 100.0 + i) for i in range(18)]
    rows += [sample(0, 0, 10 + 5 * i, 80.0) for i in range(30)]
    rows += [
        event("CHECKPOINT", 20 + 8 * i, f"pulled step-{i:06d}", step=12 * (i + 1))
        for i in range(checkpoints)
    ]
    return ledger_with(tmp_path, make_job(state="SUCCEEDED", ended=at(200)), rows)


def test_the_report_draws_rank_0_s_loss_step_and_throughput_beside_gpu_use_and_spend(
    tmp_path: Path,
) -> None:
    ledger = trained_job(tmp_path, checkpoints=2)
    result = write_report(Settings(home=tmp_path / "orch"), ledger, "rep-1", out=None, html=False)
    assert png_size(result.path.read_bytes()) == (1100, 1100) and result.progress == 18
    figure = draw_figure(report_data(ledger, "rep-1", now=at(300)))
    by_label = panels(figure)
    assert {"GPU utilization (%)", "loss (rank 0)", "step", "spend (USD)"} <= set(by_label)
    assert "throughput\n(samples/s)" in by_label
    loss = lines(by_label["loss (rank 0)"])["loss"]
    assert list(loss.get_xdata()) == [10 + 10 * i for i in range(18)]  # seconds: a short job
    assert list(loss.get_ydata()) == pytest.approx([2.5 - 0.1 * i for i in range(18)])
    step = lines(by_label["step"])["step"]
    assert list(step.get_ydata()) == [4 * (i + 1) for i in range(18)]
    assert step.get_drawstyle() == "steps-post"
    rate = lines(by_label["throughput\n(samples/s)"])["throughput"]
    assert list(rate.get_ydata()) == [100.0 + i for i in range(18)]
    legend = by_label["loss (rank 0)"].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["loss", "step"]
    # Every panel shares the one time axis.
    assert {axes.get_xlim() for axes in by_label.values()} == {(0.0, 200.0)}


def test_a_job_without_progress_says_so_instead_of_drawing_nothing(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, make_job(), [lease("a", "1", 1, 30)])
    figure = draw_figure(report_data(ledger, "rep-1", now=at(60)))
    assert "rank 0 reported no progress" in texts(figure)
    assert "rank 0 reported no throughput" in texts(figure)
    assert "step" not in panels(figure)


def test_checkpoints_are_ticks_on_the_time_axis_with_a_few_labels_that_do_not_overlap(
    tmp_path: Path,
) -> None:
    ledger = trained_job(tmp_path, checkpoints=20)
    data = report_data(ledger, "rep-1", now=at(300))
    figure = draw_figure(data)
    figure.canvas.draw()
    positions = [20 + 8 * i for i in range(20)]
    for axes in panels(figure).values():
        vertical = [
            line
            for line in axes.get_lines()
            if list(line.get_xdata()) in ([p, p] for p in positions)
        ]
        assert vertical == []  # no line across the panel for a checkpoint
    spend = panels(figure)["spend (USD)"]
    (ticks,) = [line for line in spend.get_lines() if line.get_marker() == "|"]
    assert list(ticks.get_xdata()) == positions
    assert "checkpoint (20)" in [t.get_text() for t in spend.get_legend().get_texts()]
    labels = [t for t in spend.texts if t.get_text().startswith("@")]
    assert 1 <= len(labels) <= 3
    assert {t.get_text() for t in labels} >= {"@12", "@240"}  # the first and the last
    assert all(t.get_rotation() == 0 for t in labels)
    renderer = figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert all(not t.get_text().startswith("CHECKPOINT") for t in figure.findobj(Text))


def test_labelled_checkpoints_keep_the_last_and_first_and_stay_apart() -> None:
    assert labelled_checkpoints([], 100) == []
    assert labelled_checkpoints([50], 100) == [0]
    assert labelled_checkpoints([10, 11, 12], 100) == [2]  # too close: the newest alone
    assert labelled_checkpoints([float(i) for i in range(100)], 100) == [0, 50, 99]
    assert len(labelled_checkpoints([float(i) for i in range(100)], 100, most=2)) == 2


def test_a_failed_job_shows_the_first_lines_of_its_reason(tmp_path: Path) -> None:
    job = make_job(state="FAILED", ended=at(40))
    job.reason = (
        "rank 0 (node 0): RuntimeError: loss is $nan$\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
    )
    ledger = ledger_with(tmp_path, job, [lease("a", "1", 1, 40), event("FAILED", 40)])
    figure = draw_figure(report_data(ledger, "rep-1", now=at(60)))
    (box,) = [t for t in figure.findobj(Text) if "RuntimeError" in t.get_text()]
    assert "rank 0 (node 0): RuntimeError: loss is \\$nan\\$" in box.get_text()
    assert "Traceback (most recent call last):" in box.get_text()
    assert "train.py" not in box.get_text()
    assert box.get_bbox_patch() is not None  # a text box, not loose text
    out = tmp_path / "failed.png"
    out.write_bytes(render_png(report_data(ledger, "rep-1", now=at(60))))
    width, height = png_size(out.read_bytes())
    assert width == 1100 and height > 1100  # the box takes a row of its own


def test_a_cpu_node_draws_no_gpu_that_nvidia_smi_never_reported(tmp_path: Path) -> None:
    rows = [sample(0, 0, 4, None, ok=False), sample(0, -1, 5, 150.0), sample(0, -1, 9, 120.0)]
    ledger = ledger_with(tmp_path, make_job(), rows)
    figure = draw_figure(report_data(ledger, "rep-1", now=at(20)))
    util = panels(figure)["job CPU use (% of one core)"]
    assert [t.get_text() for t in util.get_legend().get_texts()] == ["node 0 CPU"]
    assert not any("GPU" in text for text in texts(figure))
