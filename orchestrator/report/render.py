"""Pictures of a job: one PNG of stacked panels (matplotlib) and a self-contained HTML page.

matplotlib is imported inside the functions that draw, so commands that draw nothing stay
fast. Drawing uses an Agg canvas of its own (no pyplot, no global figure state).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from orchestrator.report.data import Marker, ReportData, UtilSeries, time_unit

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text

CATEGORY_STYLE: dict[str, dict[str, Any]] = {
    "start": {"color": "#2ca02c", "linestyle": "-", "linewidth": 1.2},
    "checkpoint": {"color": "#7f7f7f", "linestyle": ":", "linewidth": 0.9},
    "interruption": {"color": "#d62728", "linestyle": "-", "linewidth": 1.6},
    "recovery": {"color": "#ff7f0e", "linestyle": "--", "linewidth": 1.4},
    "controller": {"color": "#9467bd", "linestyle": "-.", "linewidth": 1.2},
    "end": {"color": "#000000", "linestyle": "-", "linewidth": 1.4},
}
# What each kind of mark means, in the legend (events by MARKED_EVENTS' categories).
MARK_LEGEND: dict[str, str] = {
    "start": "run started (RUNNING)",
    "interruption": "interrupted (PREEMPTED)",
    "recovery": "recovery (SALVAGED, RECOVERING, RESUMED)",
    "controller": "controller (ADOPTED, REBUILT, RESTARTED)",
    "end": "job ended",
    "checkpoint": "checkpoint",
    "unknown": "unknown reading (node gave none)",
}
UNKNOWN_STYLE: dict[str, Any] = {"linestyle": "none", "marker": "x", "color": "#555555"}
# Checkpoints are ticks on the time axis; at most this many of them carry their step.
MAX_CHECKPOINT_LABELS = 3
# Two labelled checkpoints are at least this share of the axis apart.
CHECKPOINT_LABEL_GAP = 0.12
# Event labels: points between a label and its line, and between two labels of a row.
LABEL_PAD_PT = 2.0
# Without a loss or throughput from rank 0, what to print so that there is one.
NO_PROGRESS_HINT = (
    "rank 0 reported no progress. To draw it, print JSON lines such as\n"
    '{"step": 12, "loss": 0.53}, or give the job a pattern for its own lines:\n'
    "progress: {pattern: 'Epoch (?P<step>\\d+)'}  (docs/spec.md#progress)"
)
NO_LOSS_HINT = (
    'rank 0 reported no loss. To draw it, add "loss" to its JSON lines,\n'
    "or a (?P<loss>...) group to progress.pattern"
)
NO_THROUGHPUT_HINT = 'rank 0 reported no throughput ("img_s" in its JSON lines)'
# A budget more than this many times the spend is noted, not drawn: the curve would be flat.
BUDGET_SCALE_LIMIT = 4
# A loss whose largest value is this many times its smallest is drawn on a log scale.
LOG_LOSS_RATIO = 50.0
# Room (points) right of the loss panel for its step axis: five-digit numbers and a label.
STEP_AXIS_WIDTH_PT = 62
# The report's rows, top to bottom, and their heights (inches).
LEGEND_SERIES_LIMIT = 8  # lines past which the legend names nodes, not each GPU
PANEL_HEIGHTS = {
    "utilization": 2.5, "memory": 1.5, "loss": 1.9, "throughput": 1.2, "spend": 1.7,
}  # fmt: skip
MIB_PER_GIB = 1024.0


def _text(value: object) -> str:
    """A ledger string made safe for matplotlib, which reads `$...$` as math."""
    return str(value).replace("$", r"\$")


def usd_text(value: Decimal | float) -> str:
    """USD for people: cents from $10, a hundredth of a cent below (tiny local prices)."""
    amount = float(value)
    return f"${amount:,.2f}" if abs(amount) >= 10 else f"${amount:,.4f}"


def _decimals_for(top: float) -> int:
    """Decimals that tell apart the ticks of a money axis reaching `top`."""
    if top <= 0:
        return 2
    return min(8, max(2, 1 - math.floor(math.log10(top))))


def labelled_checkpoints(
    positions: Sequence[float],
    span: float,
    *,
    most: int = MAX_CHECKPOINT_LABELS,
    gap: float = CHECKPOINT_LABEL_GAP,
) -> list[int]:
    """Which checkpoints (indices into `positions`, in time order) carry a label: the last,
    the first, then evenly between, at most `most`, no two closer than `gap` of `span`."""
    count = len(positions)
    if count == 0 or most < 1:
        return []
    between = [round((count - 1) * k / (most - 1)) for k in range(1, most - 1)]
    candidates = [count - 1, 0, *between]
    chosen: list[int] = []
    for index in candidates:
        if len(chosen) == most or index in chosen:
            continue
        if all(abs(positions[index] - positions[c]) >= gap * span for c in chosen):
            chosen.append(index)
    return sorted(chosen)


def label_rows(
    spans: Sequence[tuple[float, float]], *, rows: int, gap: float = 0.0
) -> list[int | None]:
    """The row (0: the top) of each label, given its horizontal extent (start, end) and in
    time order: the first row where it keeps `gap` from every label already there; None when
    no row of `rows` has room (the label is left out, its line stays)."""
    taken: list[list[tuple[float, float]]] = [[] for _ in range(max(0, rows))]
    placed: list[int | None] = []
    for start, end in spans:
        row = next(
            (
                r
                for r, there in enumerate(taken)
                if all(end + gap <= a or start >= b + gap for a, b in there)
            ),
            None,
        )
        if row is not None:
            taken[row].append((start, end))
        placed.append(row)
    return placed


def draw_figure(data: ReportData, *, dpi: int = 100) -> Figure:
    """The report as a matplotlib figure on an Agg canvas of its own: GPU utilization per
    node (or the job's CPU use without GPUs), GPU memory (left out when no node has a GPU),
    rank 0's loss and step, its throughput, and spend with the budget line, on one time axis
    (`draw_rows`). A job that did not succeed says why above them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    heights_of = dict(PANEL_HEIGHTS)
    if data.utilization_kind == "cpu":  # no GPU memory: its room goes to the CPU use
        heights_of["utilization"] += heights_of.pop("memory")
    rows = list(heights_of)
    heights = list(heights_of.values())
    if data.reason:
        heights.insert(0, 0.25 + 0.2 * len(data.reason))
    figure = Figure(figsize=(11, 2.2 + sum(heights)), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    if data.reason:
        _draw_reason(figure.add_subplot(grid[0]), data.reason)
    first = len(heights) - len(rows)
    figure.suptitle(
        _text(
            f"{data.job_id}: {data.state} on {data.provider}, {data.nodes} node(s) x "
            f"{data.gpus_per_node}, spend {usd_text(data.total_spend)}"
        ),
        fontsize=12,
    )
    draw_rows(figure, [grid[first + i] for i in range(len(rows))], data, rows)
    return figure


def draw_rows(figure: Figure, cells: Sequence[Any], data: ReportData, rows: Sequence[str]) -> bool:
    """Draw the report's `rows` (names of PANEL_HEIGHTS, in that order) into `cells` of
    `figure` (gridspec cells, one per row) on one shared time axis: the report figure and
    each dashboard panel (`panels.render_panel_svg`) are drawn by this one function.

    Events are vertical lines on every row, labelled on the first; checkpoints are ticks on
    the time axis, with a few steps and the legend of every kind of event on the last row,
    which alone carries the time axis's numbers and label. True when the figure's layout was
    run to place the event labels (it then holds as is)."""
    from matplotlib.ticker import FuncFormatter
    from matplotlib.transforms import offset_copy

    span = max(data.seconds(data.end), 1.0)
    unit, divisor = time_unit(span)

    def x(at: Any) -> float:
        return data.seconds(at) / divisor

    axes_of: dict[str, Axes] = {}
    for row, cell in zip(rows, cells, strict=True):
        shared = next(iter(axes_of.values()), None)
        axes_of[row] = figure.add_subplot(cell, sharex=shared)
    step_axes = None
    if "utilization" in axes_of:
        _draw_utilization(axes_of["utilization"], data, x)
    if "memory" in axes_of:
        _draw_memory(axes_of["memory"], data, x)
    if "loss" in axes_of:
        step_axes = _draw_progress(axes_of["loss"], axes_of["throughput"], data, x)
    if "spend" in axes_of:
        spend_axes = axes_of["spend"]
        _draw_spend(spend_axes, data, x)
        decimals = _decimals_for(spend_axes.get_ylim()[1])
        spend_axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: rf"\${v:,.{decimals}f}"))
    panels = list(axes_of.values())
    top, bottom = panels[0], panels[-1]
    event_labels: list[tuple[Text, float]] = []
    for axes in panels:
        axes.set_xlim(0, span / divisor)
        event_labels += _draw_markers(axes, data.markers, x, labelled=axes is top)
        _draw_checkpoints(axes, data.markers, x, labelled=axes is bottom)
        axes.grid(True, alpha=0.3)
        if axes is not bottom:
            axes.tick_params(labelbottom=False)
    for axes in panels:
        handles, labels = axes.get_legend_handles_labels()
        stepped = axes is axes_of.get("loss") and step_axes is not None
        if stepped:
            more = step_axes.get_legend_handles_labels()  # type: ignore[union-attr]
            handles, labels = handles + more[0], labels + more[1]
        if axes is bottom:  # every kind of event line drawn, explained once
            more = _event_legend(data.markers)
            handles, labels = handles + more[0], labels + more[1]
        if handles:
            # The step axis's numbers and label sit right of the loss panel: its legend goes
            # beyond them.
            right = STEP_AXIS_WIDTH_PT if stepped else 6
            anchor = offset_copy(axes.transAxes, fig=figure, x=right, units="points")
            axes.legend(
                handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                bbox_transform=anchor, fontsize=8, borderaxespad=0,
            )  # fmt: skip
    bottom.set_xlabel(
        f"time since submission ({unit}); submitted {data.start:%Y-%m-%d %H:%M:%S} UTC"
    )
    if event_labels:
        figure.draw_without_rendering()  # the panels' places and the labels' sizes
        _place_event_labels(top, event_labels)
    return bool(event_labels)


def render_png(data: ReportData, *, dpi: int = 100) -> bytes:
    """The report (`draw_figure`) as PNG bytes."""
    buffer = io.BytesIO()
    draw_figure(data, dpi=dpi).savefig(buffer, format="png")
    return buffer.getvalue()


def _note(axes: Axes, text: str) -> None:
    """A grey note in the middle of a panel that has nothing to draw."""
    axes.text(
        0.5, 0.5, _text(text), transform=axes.transAxes, ha="center", va="center",
        color="#555555", zorder=5,
        bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "#cccccc"},
    )  # fmt: skip


def _draw_reason(axes: Axes, reason: Sequence[str]) -> None:
    axes.set_axis_off()
    axes.text(
        0.0, 0.5, _text("why it ended: " + "\n".join(reason)), transform=axes.transAxes,
        ha="left", va="center", fontsize=9, family="monospace", color="#8b0000",
        bbox={"boxstyle": "round,pad=0.4", "facecolor": "#fdecea", "edgecolor": "#d62728"},
    )  # fmt: skip


def _draw_utilization(axes: Axes, data: ReportData, x: Any) -> None:
    kind = data.utilization_kind
    axes.set_ylabel(
        {
            "gpu": "GPU utilization (%)",
            "cpu": "job CPU use (% of one core)",
            "mixed": "GPU utilization / job CPU (%)",
        }.get(kind, "utilization (%)")
    )
    if kind == "none":
        _note(axes, _waiting(data, "GPU or CPU readings"))
        axes.set_ylim(0, 100)
        return
    top = 100.0
    unknown_drawn = False
    styles = series_styles(data.utilization)
    for series in data.utilization:
        values = [math.nan if v is None else v for v in series.values]
        times = [x(t) for t in series.times]
        colour, label = styles[(series.node, series.gpu)]
        axes.plot(
            times, values, marker="o" if len(times) < 30 else None, markersize=3,
            linewidth=1.4, label=label, color=colour,
            gid=f"utilization:{series.node}:{series.gpu}",
        )  # fmt: skip
        unknown = [x(t) for t in series.unknown_times]
        if unknown:
            axes.plot(
                unknown, [0.0] * len(unknown), **UNKNOWN_STYLE, clip_on=False, gid="mark:unknown",
                label="_" if unknown_drawn else MARK_LEGEND["unknown"],
            )  # fmt: skip
            unknown_drawn = True
        top = max([top, *(v for v in values if not math.isnan(v))])
    axes.set_ylim(0, top * 1.08)


def _waiting(data: ReportData, what: str) -> str:
    """The note of a panel with nothing to draw: `what` may still come while the job runs."""
    return f"no {what} yet" if data.live else f"no {what} were recorded"


def series_styles(series: Sequence[UtilSeries]) -> dict[tuple[int, int], tuple[str, str]]:
    """The colour and legend label of each (node, GPU) line: a colour and a label each, or,
    past `LEGEND_SERIES_LIMIT` lines (a legend that would not fit), a colour per node and one
    label per node naming its GPU count ("_" hides the others' labels)."""
    if len(series) <= LEGEND_SERIES_LIMIT:
        return {(s.node, s.gpu): (f"C{i % 10}", _text(s.label)) for i, s in enumerate(series)}
    counts = Counter(s.node for s in series)
    styles: dict[tuple[int, int], tuple[str, str]] = {}
    labelled: set[int] = set()
    for s in series:
        first = s.node not in labelled
        labelled.add(s.node)
        label = f"node {s.node} ({counts[s.node]} GPUs)" if first else "_"
        styles[(s.node, s.gpu)] = (f"C{s.node % 10}", label)
    return styles


def _draw_memory(axes: Axes, data: ReportData, x: Any) -> None:
    """GPU memory used per node and GPU (GiB), each GPU's capacity dotted in its colour (the
    colour of its utilization line)."""
    axes.set_ylabel("GPU memory (GiB)")
    if not data.memory:
        cpu_only = data.utilization_kind == "cpu"
        _note(axes, "these nodes have no GPU" if cpu_only else _waiting(data, "GPU readings"))
        axes.set_ylim(0, 1)
        return
    styles = series_styles(data.utilization)
    top = 0.0
    for series in data.memory:
        colour, label = styles.get((series.node, series.gpu), ("#1f77b4", _text(series.label)))
        times = [x(t) for t in series.times]
        used = [math.nan if v is None else v / MIB_PER_GIB for v in series.used_mib]
        total = [math.nan if v is None else v / MIB_PER_GIB for v in series.total_mib]
        axes.plot(
            times, used, color=colour, linewidth=1.4, label=label,
            marker="o" if len(times) < 30 else None, markersize=3,
            gid=f"memory:{series.node}:{series.gpu}",
        )  # fmt: skip
        axes.plot(times, total, color=colour, linestyle=":", linewidth=1.0, label="_")
        top = max([top, *(v for v in used + total if not math.isnan(v))])
    if not any(series.known for series in data.memory):
        _note(axes, _waiting(data, "GPU memory readings"))
    # One legend entry for every GPU's capacity line.
    axes.plot([], [], color="#555555", linestyle=":", linewidth=1.0, label="capacity (dotted)")
    axes.set_ylim(0, top * 1.08 if top > 0 else 1.0)


def _draw_progress(loss_axes: Axes, rate_axes: Axes, data: ReportData, x: Any) -> Axes | None:
    """Rank 0's loss (with its step on a second axis, returned) and its throughput."""
    loss_axes.set_ylabel("loss (rank 0)")
    rate_axes.set_ylabel("throughput\n(samples/s)")
    points = data.progress
    losses = [(x(p.at), p.loss) for p in points if p.loss is not None]
    rates = [(x(p.at), p.img_s) for p in points if p.img_s is not None]
    if losses:
        loss_axes.plot(
            [t for t, _ in losses], [v for _, v in losses], color="#d62728", linewidth=1.6,
            marker="o" if len(losses) < 30 else None, markersize=3, label="loss",
        )  # fmt: skip
        low, high = min(v for _, v in losses), max(v for _, v in losses)
        if low > 0 and high / low >= LOG_LOSS_RATIO:
            loss_axes.set_yscale("log")
    else:
        _note(loss_axes, NO_LOSS_HINT if points else NO_PROGRESS_HINT)
    steps = None
    if points:
        steps = loss_axes.twinx()
        steps.plot(
            [x(p.at) for p in points], [p.step for p in points], color="#7f7f7f",
            linestyle="--", linewidth=1.0, drawstyle="steps-post", label="step",
        )  # fmt: skip
        steps.set_ylabel("step", color="#555555")
        steps.set_ylim(bottom=0)
    if rates:
        rate_axes.plot(
            [t for t, _ in rates], [v for _, v in rates], color="#17becf", linewidth=1.4,
            marker="o" if len(rates) < 30 else None, markersize=3, label="throughput",
        )  # fmt: skip
        rate_axes.set_ylim(0, max(v for _, v in rates) * 1.15 or 1.0)
    else:
        _note(rate_axes, NO_THROUGHPUT_HINT)
    return steps


def _draw_spend(axes: Axes, data: ReportData, x: Any) -> None:
    axes.set_ylabel("spend (USD)")
    times = [x(point.at) for point in data.spend]
    values = [float(point.usd) for point in data.spend]
    axes.plot(times, values, color="#1f77b4", linewidth=1.8, label="spend")
    axes.fill_between(times, values, color="#1f77b4", alpha=0.15)
    peak = max(values, default=0.0)
    budget = data.budget_usd
    if budget is not None and float(budget) <= BUDGET_SCALE_LIMIT * max(peak, 1e-9):
        axes.axhline(
            float(budget), color="#d62728", linestyle="--", linewidth=1.4,
            label=_text(f"budget {usd_text(budget)}"),
        )  # fmt: skip
        axes.set_ylim(0, max(float(budget), peak) * 1.1)  # spend past a cap stays in sight
    else:
        axes.set_ylim(0, peak * 1.25 if peak > 0 else 1.0)
        if budget is not None:
            share = 100 * peak / float(budget)
            # above the panel, where the event labels along its top edge never cover it
            axes.set_title(
                _text(f"budget {usd_text(budget)} is off the scale ({share:.2g} % spent)"),
                loc="left", color="#d62728", fontsize=9,
            )  # fmt: skip
    if not data.spend or peak == 0:
        _note(axes, "nothing billed")


def _draw_markers(
    axes: Axes, markers: Sequence[Marker], x: Any, *, labelled: bool
) -> list[tuple[Text, float]]:
    """Every event but the checkpoints: a vertical line; on the `labelled` panel its label,
    returned with its line's position to be placed (`_place_event_labels`) once the figure's
    layout is known."""
    labels = []
    for marker in markers:
        if marker.category == "checkpoint":
            continue
        position = x(marker.at)
        axes.axvline(
            position, alpha=0.8, gid=f"mark:{marker.category}", **CATEGORY_STYLE[marker.category]
        )
        if not labelled:
            continue
        text = axes.text(
            position, 0.98, _text(marker.label), transform=axes.get_xaxis_transform(),
            va="top", ha="left", fontsize=7, color=CATEGORY_STYLE[marker.category]["color"],
            gid="event-label", bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                                     "alpha": 0.85, "edgecolor": "none"},
        )  # fmt: skip
        text.set_in_layout(False)  # placed after the layout: it must not move the panels
        labels.append((text, position))
    return labels


def _place_event_labels(axes: Axes, labels: Sequence[tuple[Text, float]]) -> None:
    """Each label beside its line (right of it, or left where the panel ends), in the first
    row from the top where it overlaps no other label (`label_rows`); one that finds no row
    in the panel's upper part is left out (the legend still tells its line)."""
    renderer = axes.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = axes.get_window_extent(renderer)
    pad = LABEL_PAD_PT * axes.figure.dpi / 72
    spans: list[tuple[float, float]] = []
    height = 0.0
    for text, position in labels:
        box = text.get_window_extent(renderer)
        line = axes.transData.transform((position, 0.0))[0]
        start = line + pad if line + pad + box.width <= frame.x1 else line - pad - box.width
        spans.append((start, start + box.width))
        height = max(height, box.height)
    row_height = height + pad
    rows = int(frame.height * 0.75 // row_height) if row_height > 0 else 0
    top = frame.y1 - pad
    placed = label_rows(spans, rows=rows, gap=pad)
    for (text, _), (start, _end), row in zip(labels, spans, placed, strict=True):
        if row is None:
            text.remove()
            continue
        # Its box's corner in the panel's own fractions, so the placement holds at any size.
        text.set_transform(axes.transAxes)
        text.set_position(
            ((start - frame.x0) / frame.width, (top - row * row_height - frame.y0) / frame.height)
        )
        text.set_horizontalalignment("left")


def _event_legend(markers: Sequence[Marker]) -> tuple[list[Any], list[str]]:
    """Legend entries for the kinds of event line drawn, in the order they are first met."""
    from matplotlib.lines import Line2D

    kinds = list(dict.fromkeys(m.category for m in markers if m.category != "checkpoint"))
    handles = [Line2D([], [], **CATEGORY_STYLE[kind]) for kind in kinds]
    return handles, [MARK_LEGEND[kind] for kind in kinds]


def _draw_checkpoints(axes: Axes, markers: Sequence[Marker], x: Any, *, labelled: bool) -> None:
    """Checkpoints as ticks on the panel's time axis; on the `labelled` panel a legend entry
    and the steps of a few of them (`labelled_checkpoints`)."""
    checkpoints = [m for m in markers if m.category == "checkpoint"]
    if not checkpoints:
        return
    color = CATEGORY_STYLE["checkpoint"]["color"]
    positions = [x(m.at) for m in checkpoints]
    axes.plot(
        positions, [0.0] * len(positions), linestyle="none", marker="|", markersize=12,
        markeredgewidth=1.5, color=color, transform=axes.get_xaxis_transform(), clip_on=False,
        label=f"{MARK_LEGEND['checkpoint']} ({len(positions)})" if labelled else "_",
        gid="mark:checkpoint",
    )  # fmt: skip
    if not labelled:
        return
    low, high = axes.get_xlim()
    for index in labelled_checkpoints(positions, high - low):
        marker = checkpoints[index]
        text = "checkpoint" if marker.step is None else f"@{marker.step}"
        axes.text(
            positions[index], 0.05, text, transform=axes.get_xaxis_transform(), ha="center",
            va="bottom", fontsize=7, color="#444444",
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8,
                  "edgecolor": "none"},
        )  # fmt: skip


# --- HTML -------------------------------------------------------------------------------------


def _cell(value: object) -> str:
    return "" if value is None else html.escape(str(value), quote=True)


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_cell(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(value)}</td>" for value in row) + "</tr>" for row in rows
    )
    return (
        f"<h2>{_cell(title)}</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n"
        f"<tbody>{body}</tbody>\n</table>\n"
    )


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td { white-space: pre-wrap; }
img { max-width: 100%; border: 1px solid #ddd; }
"""


def render_html(document: dict, png: bytes) -> str:
    """A self-contained page: the report PNG embedded as base64, then the job's summary, its
    leases and its events. `document` is the job's `orch status JOB --json` document; every
    string from it is escaped."""
    job_id = document["id"]
    summary = [
        ("id", job_id),
        ("name", document.get("name")),
        ("state", document["state"]),
        ("provider", document["provider"]),
        ("nodes", document["nodes"]),
        ("GPUs per node", document["gpus_per_node"]),
        ("step", document.get("step")),
        ("loss", document.get("loss")),
        ("spend (USD)", f"{document['spend_usd']:.6f}"),
        ("recoveries", document.get("recoveries")),
        ("checkpoints", len(document.get("checkpoints", []))),
        ("created", document.get("created_at")),
        ("started", document.get("started_at")),
        ("ended", document.get("ended_at")),
        ("exit code", document.get("exit_code")),
        ("reason", document.get("reason")),
    ]
    leases = [
        (
            lease["rank"],
            lease["instance_id"],
            lease["market"],
            lease["instance_type"],
            lease["price_per_hour"],
            lease["launched_at"],
            lease["ended_at"] or "running",
            f"{lease['cost_usd']:.6f}",
        )  # fmt: skip
        for lease in document.get("leases", [])
    ]
    events = [
        (event["at"], event["kind"], event["step"], event["message"])
        for event in document.get("events", [])
    ]
    image = base64.b64encode(png).decode("ascii")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>orch report: {_cell(job_id)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>orch report: {_cell(job_id)}</h1>\n"
        f'<img alt="report of job {_cell(job_id)}" src="data:image/png;base64,{image}">\n'
        + _table("job", ("field", "value"), summary)
        + _table(
            "leases",
            ("rank", "instance", "market", "type", "USD/h", "launched", "ended", "cost (USD)"),
            leases,
        )
        + _table("events", ("at", "kind", "step", "message"), events)
        + "</body>\n</html>\n"
    )
