"""One panel of a job's report as a compact SVG, for a page that shows the panels one by one.

A panel is drawn by the report's own `render.draw_rows`, so what a page shows is what
`orch report` draws (the same series, notes, event lines, checkpoint ticks and legends):

- `gpu`: GPU utilization per node and GPU (the job's CPU use on nodes without GPUs);
- `memory`: GPU memory used per node and GPU, with each GPU's capacity;
- `progress`: rank 0's loss and step, and below it its throughput;
- `spend`: what the job's leases cost so far, with its budget cap.

The SVG keeps its text as text (`svg.fonttype: none`), sizes itself in inches (8 wide) and
carries no date, so the same data gives the same bytes.
"""

from __future__ import annotations

import io

from orchestrator.report.data import ReportData

PANELS = ("gpu", "memory", "progress", "spend")
# The report's rows (`render.PANEL_HEIGHTS`) each panel draws.
PANEL_ROWS: dict[str, tuple[str, ...]] = {
    "gpu": ("utilization",),
    "memory": ("memory",),
    "progress": ("loss", "throughput"),
    "spend": ("spend",),
}
WIDTH_IN = 8.0
ROW_HEIGHT_IN = 2.6  # one row; a panel of two rows is taller, its rows as the report's
SVG_SETTINGS = {"svg.fonttype": "none", "svg.hashsalt": "orch-panel"}


def render_panel_svg(data: ReportData, panel: str) -> bytes:
    """The `panel` (one of PANELS) of `data`'s report as SVG bytes; ValueError for another
    name. A panel with nothing to draw says so in the picture."""
    if panel not in PANEL_ROWS:
        raise ValueError(f"no panel {panel!r}: the panels are {', '.join(PANELS)}")
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from orchestrator.report.render import PANEL_HEIGHTS, draw_rows

    rows = PANEL_ROWS[panel]
    heights = [PANEL_HEIGHTS[row] for row in rows]
    height = ROW_HEIGHT_IN * sum(heights) / max(heights)
    with matplotlib.rc_context(SVG_SETTINGS):
        figure = Figure(figsize=(WIDTH_IN, height), layout="constrained")
        FigureCanvasAgg(figure)  # lays out the labels; savefig writes the SVG
        grid = figure.add_gridspec(len(rows), 1, height_ratios=heights)
        if not draw_rows(figure, [grid[i] for i in range(len(rows))], data, rows):
            figure.draw_without_rendering()
        figure.set_layout_engine("none")  # laid out once: the save keeps those places
        buffer = io.BytesIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()
