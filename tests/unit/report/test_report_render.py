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
from orchestrator.report.render import (
    CATEGORY_STYLE,
    MARK_LEGEND,
    draw_figure,
    label_rows,
    labelled_checkpoints,
    render_html,
    render_png,
)
from orchestrator.report.write import report_data, write_report
from tests.unit.report.test_report_data import (
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


def test_a_job_without_progress_says_how_to_report_it(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, make_job(), [lease("a", "1", 1, 30)])
    figure = draw_figure(report_data(ledger, "rep-1", now=at(60)))
    (note,) = [t for t in texts(figure) if t.startswith("rank 0 reported no progress")]
    assert '{"step": 12, "loss": 0.53}' in note  # what to print
    assert "progress: {pattern: 'Epoch (?P<step>\\d+)'}" in note  # or the pattern to give
    assert "docs/spec.md#progress" in note
    assert any(t.startswith("rank 0 reported no throughput") for t in texts(figure))
    assert "step" not in panels(figure)
    stepped = ledger_with(tmp_path / "s", make_job(), [lease("a", "1", 1, 30), progress(9, 3)])
    figure = draw_figure(report_data(stepped, "rep-1", now=at(60)))
    (note,) = [t for t in texts(figure) if t.startswith("rank 0 reported no loss")]
    assert "(?P<loss>...) group to progress.pattern" in note


def recovered_job(tmp_path: Path) -> Ledger:
    """A spot job whose node was reclaimed, recovered within seconds, reclaimed again and
    recovered, its controller taken over in between: eleven events inside 15 s of 300."""
    rows: list[object] = [lease("a", "1", 1, 95), lease("b", "1", 96, 300), event("RUNNING", 5)]
    for start in (90, 100):
        rows += [
            event("PREEMPTED", start, "node 0 reclaimed", step=40),
            event("SALVAGED", start + 1, "kept snapshot.pt", step=40),
            event("RECOVERING", start + 1.5, step=40),
            event("RESUMED", start + 4, "from snapshot.pt", step=40),
        ]
    rows += [event("ADOPTED", 97), event("RESTARTED", 103), event("SUCCEEDED", 290)]
    rows += [event("CHECKPOINT", 20 + 10 * i, "pulled snapshot.pt", step=4 * i) for i in range(25)]
    rows += [
        sample(0, 0, 10 + 5 * i, None if i % 9 == 4 else 80.0, ok=i % 9 != 4) for i in range(56)
    ]
    rows += [progress(10 + 10 * i, 4 * i, 2.0 - 0.05 * i) for i in range(28)]
    return ledger_with(tmp_path, make_job(state="SUCCEEDED", ended=at(300)), rows)


EVENT_LABELS = sorted(
    ["RUNNING", "ADOPTED", "RESTARTED", "SUCCEEDED"]
    + [f"{kind} @40" for kind in ("PREEMPTED", "SALVAGED", "RECOVERING", "RESUMED")] * 2
)


def event_lines(axes: Axes) -> list[Line2D]:
    """The vertical lines of the events drawn across `axes`."""
    return [
        line
        for line in axes.get_lines()
        if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]
    ]


def test_event_labels_never_overlap_however_close_the_events(tmp_path: Path) -> None:
    figure = draw_figure(report_data(recovered_job(tmp_path), "rep-1", now=at(400)))
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    labels = [t for t in figure.findobj(Text) if t.get_text().strip() in EVENT_LABELS]
    assert sorted(t.get_text().strip() for t in labels) == EVENT_LABELS  # none left out
    boxes = [t.get_window_extent(renderer) for t in labels]
    overlapping = [
        (labels[i].get_text(), labels[j].get_text())
        for i, a in enumerate(boxes)
        for j, b in enumerate(boxes[i + 1 :], start=i + 1)
        if a.overlaps(b)
    ]
    assert overlapping == []
    util_axes = panels(figure)["GPU utilization (%)"]
    util = util_axes.get_window_extent(renderer)
    assert all(util.x0 <= box.x0 and box.x1 <= util.x1 for box in boxes)  # inside its panel
    for text, box in zip(labels, boxes, strict=True):  # each beside a line of its colour
        lines = [
            line.get_transform().transform((line.get_xdata()[0], 0))[0]
            for line in event_lines(util_axes)
            if line.get_color() == text.get_color()
        ]
        assert min(min(abs(box.x0 - x), abs(box.x1 - x)) for x in lines) < 6, text.get_text()


def test_label_rows_stack_close_labels_and_leave_out_what_does_not_fit() -> None:
    spans = [(0.0, 10.0), (5.0, 15.0), (12.0, 20.0), (30.0, 40.0), (6.0, 7.0)]
    assert label_rows(spans, rows=3) == [0, 1, 0, 0, 2]
    assert label_rows(spans, rows=2) == [0, 1, 0, 0, None]
    assert label_rows([(0.0, 10.0), (10.5, 12.0)], rows=2, gap=1.0) == [0, 1]


def test_the_legend_tells_every_kind_of_mark_drawn(tmp_path: Path) -> None:
    figure = draw_figure(report_data(recovered_job(tmp_path), "rep-1", now=at(400)))
    by_colour = {style["color"]: kind for kind, style in CATEGORY_STYLE.items()}
    drawn: dict[str, Line2D] = {}
    for axes in figure.axes:
        drawn.update((by_colour[line.get_color()], line) for line in event_lines(axes))
        drawn.update(("unknown", line) for line in axes.get_lines() if line.get_marker() == "x")
        drawn.update(("checkpoint", line) for line in axes.get_lines() if line.get_marker() == "|")
    assert set(drawn) == {
        "start", "interruption", "recovery", "controller", "end", "checkpoint", "unknown",
    }  # fmt: skip
    entries: dict[str, Line2D] = {}
    for axes in figure.axes:
        legend = axes.get_legend()
        if legend is not None:
            entries.update(
                zip([t.get_text() for t in legend.get_texts()], legend.legend_handles, strict=True)
            )
    for kind, line in drawn.items():
        named = [n for n in entries if n.startswith(MARK_LEGEND[kind])]
        assert len(named) == 1, f"{kind}: no legend entry in {sorted(entries)}"
        handle = entries[named[0]]
        assert (handle.get_color(), handle.get_linestyle(), handle.get_marker()) == (
            line.get_color(), line.get_linestyle(), line.get_marker()
        ), kind  # fmt: skip
    assert "unknown reading (node gave none)" in entries


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


def test_spend_past_the_budget_stays_on_the_scale(tmp_path: Path) -> None:
    # $36/h for 100 s is $1.00 against a $0.50 budget (a cap reached while a stop was under way)
    ledger = ledger_with(tmp_path, make_job(max_cost="0.5"), [lease("a", "36", 0, 100)])
    figure = draw_figure(report_data(ledger, "rep-1", now=at(120)))
    spend = panels(figure)["spend (USD)"]
    bottom, top = spend.get_ylim()
    assert bottom == 0 and top >= 1.0
    assert [t.get_text() for t in spend.get_legend().get_texts()][:2] == [
        "spend",
        r"budget \$0.5000",
    ]


def test_many_gpus_are_told_apart_by_node_in_the_legend() -> None:
    from orchestrator.report.data import UtilSeries
    from orchestrator.report.render import LEGEND_SERIES_LIMIT, series_styles

    few = [UtilSeries(0, gpu, (), ()) for gpu in range(LEGEND_SERIES_LIMIT)]
    assert [label for _, label in series_styles(few).values()] == [
        f"node 0 GPU {gpu}" for gpu in range(LEGEND_SERIES_LIMIT)
    ]
    many = [UtilSeries(node, gpu, (), ()) for node in range(4) for gpu in range(8)]
    styles = series_styles(many)
    labels = [label for _, label in styles.values() if label != "_"]
    assert labels == [f"node {node} (8 GPUs)" for node in range(4)]
    assert {styles[(1, gpu)][0] for gpu in range(8)} == {"C1"}  # one colour per node
