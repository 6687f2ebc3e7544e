"""`make bench` (bench/run_all.py): every benchmark runs as a subprocess, its figures are read
from what it prints, and the page reports each with its baseline and ratio, the machine, the
date and how to reproduce; a failing or hanging benchmark is reported, not fatal."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from bench import page_merge, run_all
from bench.run_all import Benchmark, parse_controller_cpu, parse_idle_latency, report_rows

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "bench"


def _script(tmp_path: Path, name: str, body: str) -> tuple[str, ...]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return (sys.executable, str(path))


def test_the_page_holds_figures_baselines_ratios_and_failures(tmp_path: Path) -> None:
    ok = _script(
        tmp_path,
        "ok",
        """
        from bench.common import report
        print("  rep 0: noise")
        report("stand-in (2 nodes)", [("first", 1.5, 3.0), ("again", 0.9, 0.6)], target=1.3)
        raise SystemExit(1)  # a target missed: still a result
        """,
    )
    crash = _script(tmp_path, "crash", "import sys\nprint('half')\nsys.exit('it broke')\n")
    hang = _script(tmp_path, "hang", "import time\nprint('waiting', flush=True)\ntime.sleep(60)\n")
    benches = [
        Benchmark("good", "A good one", "by hand", report_rows("by hand"), command=ok),
        Benchmark("broken", "A broken one", "none", report_rows("x"), command=crash),
        Benchmark("slow", "A hung one", "none", report_rows("x"), command=hang, timeout_s=3),
    ]
    out = tmp_path / "bench.md"
    logged: list[str] = []
    results = run_all.run_all(benches, quick=True, out=out, log=logged.append)

    assert [r.failed for r in results] == [False, True, True]
    page = out.read_text()
    assert "| [good](#good) | first | 1.5 s | 3 s (by hand) | 0.5 | ratio <= 1.3 | yes |" in page
    assert (
        "| [good](#good) | again | 0.9 s | 0.6 s (by hand) | 1.5 | ratio <= 1.3 | **no** |" in page
    )
    assert "exit code 1 (a target was missed)" in page
    assert "| [broken](#broken) | **failed: exit code 1, no figures** |" in page
    assert "it broke" in page  # the failure's own words are on the page
    assert "failed: timed out after 3 s" in page and "waiting" in page
    for fact in ("cores", "RAM", "kernel", "Python", "torch", "load average", "**quick**"):
        assert fact in page
    assert "make bench" in page and "## Reproduce" in page
    assert any("wrote" in line for line in logged)


def test_summaries_of_the_real_benchmarks_are_read() -> None:
    cpu = (
        "\ncontroller CPU watching 8 nodes every 5 s for 60 s: 1.20 % of one core (target < 3 %)\n"
        "baseline, `orch status --json` every 5 s: 2.40 % (ratio 0.50)\n"
    )
    [figure] = parse_controller_cpu(cpu)
    assert (figure.value, figure.baseline, figure.ratio, figure.met) == (1.2, 2.4, 0.5, True)
    idle = (
        "\nidle-shutdown latency (idle_timeout 10 s, watch interval 5 s): median 14.0 s over 2 "
        "trials [13.0, 15.0]; beyond the timeout: 0.80 intervals (bound 2)\n"
    )
    [figure] = parse_idle_latency(idle)
    assert (figure.value, figure.baseline, figure.ratio, figure.met) == (14.0, 10.0, 1.4, True)
    throughput = (
        "trainer throughput, CPU only (2 cores), ...\n"
        "  tiny      workers=0:    900.0 img/s  (880.0, 920.0)\n"
        "  tiny      workers=2:    450.0 img/s  (440.0, 460.0)\n"
        "  tiny      ratio workers=2 / workers=0: 0.50\n"
    )
    [figure] = run_all.parse_trainer_throughput(throughput)
    assert (figure.value, figure.baseline, figure.ratio, figure.met) == (450.0, 900.0, 0.5, None)
    spot = (
        "\nspot recovery (machine: 2 cores, 7 GiB RAM; medians of 2 trials)\n"
        "  detection_s                 2.0 s   (1.5, 2.5)\n"
        "  resume_s                   12.0 s   (11.0, 13.0)\n"
        "  cold_start_s                8.0 s   (7.0, 9.0)\n"
        "  replacing the whole cluster (recovery.replace: all)\n"
        "    detection_s                 9.0 s   (1.5, 2.5)\n"
        "  resume / cold start      orch 12.0 s / baseline 8.0 s = ratio 1.50\n"
        "  lost node / whole cluster  recovery 9.0 s / 10.0 s = ratio 0.90; cost $0.1 / $0.2\n"
    )
    figures = run_all.parse_spot_recovery(spot)
    assert (figures[0].value, figures[0].baseline, figures[0].ratio) == (12.0, 8.0, 1.5)
    assert figures[0].met is True  # resume <= 20 s
    assert (figures[1].value, figures[1].baseline, figures[1].met) == (9.0, 10.0, False)
    # the whole cluster's rows are the baseline's, not figures of their own
    assert [(f.name, f.met) for f in figures[2:]] == [("detection", True)]
    assert run_all.parse_spot_recovery("Traceback ...") == []


def test_every_benchmark_module_is_run() -> None:
    # bench/'s own parts, and the parts of single benchmarks
    helpers = {"__init__", "common", "figures", "run_all", "page_merge", "team_seed"}
    helpers.add("machine_facts")  # what run_all writes above the figures
    helpers.add("container_image")  # bench.containers' image
    modules = {p.stem for p in (REPO / "bench").glob("*.py")} - helpers
    assert {b.name for b in run_all.BENCHMARKS} == modules


def test_the_page_says_whether_the_machine_was_busy() -> None:
    assert "was shared" in run_all._load_note("3.83, 8.12, 7.69", 2)
    assert "otherwise idle" in run_all._load_note("0.10, 0.20, 0.30", 2)


def test_the_checkpoint_figures_are_read_with_their_own_targets() -> None:
    text = (
        "\ncheckpoint speed (machine: 2 cores, 23 GiB RAM; medians)\n"
        "  save -> copy in the mirror (100 MB)          orch     2.400 s        baseline     0.700"
        " s        (raw rsync of the file from the node)  ratio  3.43  target <= 5 s\n"
        "  pull of a 2048 MB checkpoint                 orch    12.000 s        baseline    11.000"
        " s        (raw rsync of the same file)  ratio  1.09  target ratio <= 1.1\n"
        "  resume push from the mirror to 2 nodes       orch    30.000 s        baseline    12.000"
        " s        (raw rsync to 1 node)  ratio  2.50  target -\n"
        "  step rate while checkpoints move             orch    18.000 steps/s  baseline    20.000"
        " steps/s  (the same loop saving where orch does not look)  ratio  0.90"
        "  target ratio >= 0.9\n"
    )
    latency, pull, push, rate = run_all.parse_checkpoint_speed(text)
    assert (latency.value, latency.met, latency.target) == (2.4, True, "<= 5 s")
    assert (pull.baseline_name, round(pull.ratio or 0, 3), pull.met) == (
        "raw rsync of the same file", 1.091, True,
    )  # fmt: skip
    assert (push.met, push.target) == (None, "")
    assert (rate.unit, rate.met) == ("steps/s", True)
    slower = run_all.parse_checkpoint_speed(text.replace("orch    18.000", "orch    17.000"))
    assert slower[-1].met is False


def test_the_capture_and_detection_figures_are_read_with_their_targets() -> None:
    text = (
        "  saves captured, rewritten every 0.5 s    orch     0.767 share    baseline     0.000"
        " share    (the quiet rule alone: take_at_look off)  ratio     -  target >= 0.3\n"
        "  saves captured, rewritten every 1 s    orch     0.400 share    baseline     0.067"
        " share    (the quiet rule alone: take_at_look off)  ratio  6.00  target >= 0.5\n"
        "  detection while saving every second  orch     5.200 s        baseline     5.900 s"
        "        (the same job saving no checkpoint)  ratio  0.88  target <= 10 s\n"
    )
    fast, slow, detection = run_all.parse_checkpoint_speed(text)
    assert (fast.value, fast.baseline, fast.ratio, fast.met) == (0.767, 0.0, None, True)
    assert (slow.unit, slow.met, slow.target) == ("share", False, ">= 0.5")
    assert (detection.value, detection.met, detection.baseline_name) == (
        5.2, True, "the same job saving no checkpoint",
    )  # fmt: skip


def test_the_guard_billing_figure_is_read_with_its_bound() -> None:
    text = (
        "  trial 0: guarded 71.2 instance-s, unlimited 126.0 instance-s over 63 s and still "
        "billing\n\nbilled after the controller's death (2 nodes, hung job; medians of 1):\n"
        "  guarded (max_runtime 30 s)       71.2 instance-s   bound 96\n"
        "  no limit (as before the guard)     126.0 instance-s in 63 s, growing by 2 per second "
        "until someone acts\n"
    )
    (figure,) = run_all.parse_guard_billing(text)
    assert (figure.value, figure.baseline, figure.bound, figure.met) == (71.2, 126.0, 96.0, True)
    assert "max_runtime 30 s" in figure.name
    (over,) = run_all.parse_guard_billing(text.replace("71.2 instance-s   ", "97.5 instance-s   "))
    assert over.met is False
    assert run_all.parse_guard_billing("guarded nodes still up 63 s after the kill") == []


def test_the_start_up_figures_are_read_with_their_targets() -> None:
    text = (
        "\nCommand start-up, 100 jobs in the ledger  (machine: 2 cores, 23 GiB RAM; medians of "
        "3; baseline: python -c 'import typer, rich.console' 0.137 s)\n"
        "  orch --help           0.212 s   baseline  0.137 s   ratio  1.55   target <= 0.3 s: met\n"
        "  orch --version        0.201 s   baseline  0.137 s   ratio  1.47\n"
        "  orch status           0.612 s   baseline  0.137 s   ratio  4.47   target <= 0.5 s: "
        "NOT met\n"
    )
    help_, version, status = run_all.parse_cli_startup(text)
    assert (help_.name, help_.value, help_.baseline, help_.bound, help_.met) == (
        "orch --help", 0.212, 0.137, 0.3, True,
    )  # fmt: skip
    assert (version.name, version.met, version.target) == ("orch --version", None, "")
    assert (status.name, status.met) == ("orch status", False)


@pytest.mark.parametrize(
    "module", sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")
)
def test_every_benchmark_imports(module: str) -> None:
    """Nothing else imports the benchmarks: a moved module would only show at `make bench`."""
    importlib.import_module(f"bench.{module}")


def _page(date: str, figures: dict[str, float], note: str = "") -> str:
    """A page as run_all writes it, of one stand-in figure per benchmark in `figures`."""
    results = [
        run_all.Result(
            Benchmark(name, f"The {name} one", "by hand", report_rows("by hand")),
            f".venv/bin/python -m bench.{name}",
            0,
            1.0,
            f"  {name} printed {value}\n",
            "",
            [run_all.Figure("time", value, "s", baseline=1.0, baseline_name="by hand")],
        )  # fmt: skip
        for name, value in figures.items()
    ]
    return run_all.render_page(
        results, machine={"CPU": "2 cores"}, quick=False,
        started_at=run_all.datetime.fromisoformat(f"{date}T04:00:00+00:00"),
        load_before="1.00, 1.00, 1.00", load_after="1.00, 1.00, 1.00", section_note=note,
    )  # fmt: skip


def test_a_page_splits_into_parts_that_join_back_to_it() -> None:
    page = _page("2026-12-01", {"a": 2.0, "b": 3.0})
    parts = page_merge.split_page(page)
    assert parts is not None
    assert list(parts.rows) == list(parts.sections) == ["a", "b"]
    assert parts.text(["a", "b"]) == page
    assert page_merge.split_page("# Benchmarks\n\nsomething else\n") is None


def test_a_run_of_one_benchmark_replaces_its_rows_and_section_and_keeps_the_others() -> None:
    order = ["a", "b", "c", "d"]
    old = _page("2026-12-01", {"a": 2.0, "b": 3.0, "c": 4.0})
    old = old.replace("  c printed 4.0", "  c printed 4.0\n(a note written by hand)")
    new = _page("2026-12-06", {"b": 9.0, "d": 7.0}, note="Measured alone on 2026-12-06.")
    merged = page_merge.merge_pages(old, new, ["b", "d"], order)
    assert merged is not None
    parts = page_merge.split_page(merged)
    assert parts is not None
    assert list(parts.rows) == list(parts.sections) == order  # d added in its place
    assert "| 9 s |" in parts.rows["b"][0] and "| 3 s |" not in merged
    assert "b printed 9.0" in merged and "b printed 3.0" not in merged
    assert "Measured alone on 2026-12-06." in "\n".join(parts.sections["b"] + parts.sections["d"])
    assert "Measured alone" not in "\n".join(parts.sections["a"] + parts.sections["c"])
    assert "| 2 s |" in parts.rows["a"][0] and "| 4 s |" in parts.rows["c"][0]
    assert "(a note written by hand)" in "\n".join(parts.sections["c"])  # kept as it was
    assert merged.startswith(old[: old.index("## Summary")])  # the header stays the old run's
    assert merged.endswith(old[old.index("## Reproduce") :])
    assert page_merge.merge_pages("not a page", new, ["b"], order) is None


def test_only_merges_into_the_page_on_disk(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    out.write_text(_page("2026-12-01", {"a": 2.0, "b": 3.0}))
    script = _script(tmp_path, "b", 'print("  b printed 5.0")\nprint("  time  orch 5.000 s'
                     '   baseline 1.000 s   ratio 5.00")\n')  # fmt: skip
    bench = Benchmark("b", "The b one", "by hand", report_rows("by hand"), command=script)
    run_all.run_all([bench], quick=True, out=out, log=lambda _: None, merge=True)
    page = out.read_text()
    assert "a printed 2.0" in page and "b printed 5.0" in page and "b printed 3.0" not in page
    assert "in a run of this benchmark alone (`.venv/bin/python -m bench.run_all --only b`)" in page


def test_the_controller_host_figures_are_read_from_its_json_line() -> None:
    text = (
        "  trial 0 host  : submit -> first step 8.6 s, recovery 9.3 s\n"
        '{"benchmark": "controller_host", "trials": 3, "submit_to_first_step_s": {"host": 12.0, '
        '"laptop": 8.0, "ratio": 1.5}, "recovery_s": {"host": 10.0, "laptop": 10.0, '
        '"ratio": 1.0}}\n'
    )
    first, recovery = run_all.parse_controller_host(text)
    assert (first.value, first.baseline, first.ratio, first.met) == (12.0, 8.0, 1.5, None)
    assert (recovery.value, recovery.baseline, recovery.ratio) == (10.0, 10.0, 1.0)
    assert run_all.parse_controller_host("Traceback ...") == []
