"""One panel of the report as SVG (`report.panels`): drawn by the report's own rows, so a GPU
memory reading is in the report figure and in its panel alike; a panel with nothing to draw
says so; the SVG keeps its text as text and its size in inches."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from orchestrator.report.data import ReportData
from orchestrator.report.panels import PANELS, render_panel_svg
from orchestrator.report.render import draw_figure
from orchestrator.report.write import report_data
from tests.unit.report.test_report_data import (
    at,
    event,
    lease,
    ledger_with,
    make_job,
    progress,
    sample,
)
from tests.unit.report.test_report_render import panels

SVG = "{http://www.w3.org/2000/svg}"


def svg_tree(data: bytes) -> ET.Element:
    root = ET.fromstring(data)
    assert root.tag == f"{SVG}svg"
    return root


def texts(root: ET.Element) -> str:
    return " ".join("".join(e.itertext()) for e in root.iter(f"{SVG}text"))


def group(root: ET.Element, gid: str) -> ET.Element:
    (found,) = [e for e in root.iter(f"{SVG}g") if e.get("id") == gid]
    return found


def markers(element: ET.Element) -> int:
    """How many point markers (a short series' readings) `element` draws."""
    return len(list(element.iter(f"{SVG}use")))


def running_job(tmp_path: Path, readings: int = 3) -> ReportData:
    rows: list[object] = [lease("a", "3.6", 1, None), event("RUNNING", 2)]
    rows += [event("PREEMPTED", 30, "node 0 reclaimed", step=4), event("RESUMED", 40, step=4)]
    for i in range(readings):
        reading = sample(0, 1, 5 + i, 70.0)
        reading.mem_used_mib = 4096.0 * (i + 1)
        rows.append(reading)
    rows += [progress(5 + i, i, 2.0 - i / 100, 50.0) for i in range(readings)]
    return report_data(ledger_with(tmp_path, make_job(max_cost="2"), rows), "rep-1", now=at(60))


def test_a_memory_reading_is_in_the_report_figure_and_in_its_panel(tmp_path: Path) -> None:
    data = running_job(tmp_path)
    assert data.memory[0].used_mib == (4096.0, 8192.0, 12288.0)
    memory = panels(draw_figure(data))["GPU memory (GiB)"]
    (used,) = [line for line in memory.get_lines() if line.get_gid() == "memory:0:1"]
    assert list(used.get_ydata()) == [4.0, 8.0, 12.0]  # GiB
    assert [line.get_label() for line in memory.get_lines()].count("node 0 GPU 1") == 1
    root = svg_tree(render_panel_svg(data, "memory"))
    assert markers(group(root, "memory:0:1")) == 3  # one per reading
    assert "GPU memory (GiB)" in texts(root) and "node 0 GPU 1" in texts(root)


def test_every_panel_is_a_compact_svg_with_text_as_text_and_the_events(tmp_path: Path) -> None:
    data = running_job(tmp_path)
    assert PANELS == ("gpu", "memory", "progress", "spend")
    expected = {
        "gpu": "GPU utilization (%)",
        "memory": "GPU memory (GiB)",
        "progress": "throughput",
        "spend": "budget $2.0000",
    }
    for panel in PANELS:
        root = svg_tree(render_panel_svg(data, panel))
        assert root.get("width") == "576pt", panel  # 8 inches
        assert root.get("height", "").endswith("pt")
        words = texts(root)
        assert expected[panel] in words, panel
        assert "interrupted (PREEMPTED)" in words, panel  # the events' legend
        assert [e for e in root.iter() if e.get("id") == "mark:interruption"], panel
        assert not [e for e in root.iter(f"{SVG}path") if e.get("id", "").startswith("DejaVu")]
    assert "PREEMPTED @4" in texts(svg_tree(render_panel_svg(data, "gpu")))  # labelled on top
    assert render_panel_svg(data, "gpu") == render_panel_svg(data, "gpu")  # no date inside


def test_a_panel_without_data_says_so(tmp_path: Path) -> None:
    data = report_data(ledger_with(tmp_path, make_job(), []), "rep-1", now=at(60))
    assert "no GPU or CPU readings yet" in texts(svg_tree(render_panel_svg(data, "gpu")))
    assert "no GPU readings yet" in texts(svg_tree(render_panel_svg(data, "memory")))
    assert "rank 0 reported no progress" in texts(svg_tree(render_panel_svg(data, "progress")))
    assert "nothing billed" in texts(svg_tree(render_panel_svg(data, "spend")))
    ended = make_job(state="FAILED", ended=at(30))
    failed = report_data(ledger_with(tmp_path / "f", ended, []), "rep-1", now=at(60))
    assert "no GPU readings were recorded" in texts(svg_tree(render_panel_svg(failed, "memory")))
    cpu = ledger_with(tmp_path / "c", make_job(), [sample(0, -1, 5, 150.0)])
    cpu_data = report_data(cpu, "rep-1", now=at(60))
    assert "these nodes have no GPU" in texts(svg_tree(render_panel_svg(cpu_data, "memory")))
    assert "GPU memory (GiB)" not in panels(draw_figure(cpu_data))  # the report leaves it out


def test_an_unknown_panel_is_refused(tmp_path: Path) -> None:
    data = report_data(ledger_with(tmp_path, make_job(), []), "rep-1", now=at(60))
    with pytest.raises(ValueError, match="no panel 'cpu'"):
        render_panel_svg(data, "cpu")


def test_a_panel_of_a_job_with_thousands_of_samples_is_drawn_whole(tmp_path: Path) -> None:
    # How fast is measured in bench/dashboard_pages.py, against a baseline of the same run.
    data = running_job(tmp_path, readings=3000)
    for panel in PANELS:
        root = svg_tree(render_panel_svg(data, panel))
        assert len(root) > 0, panel
