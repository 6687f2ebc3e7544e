"""Run every benchmark of bench/ and write docs/benchmarks.md (what `make bench` does).

Each benchmark runs as its own subprocess; its printed summary is kept and its figures read
from it: each figure with the baseline measured in the same run and their ratio. A benchmark
that fails (non-zero exit without figures, a crash, a timeout) is reported on the page with
the tail of its output; it does not stop the others, and the page is written either way.

    .venv/bin/python -m bench.run_all [--quick] [--only NAME ...] [--out docs/benchmarks.md]

`--quick` runs each benchmark with fewer repetitions (and the controller one for less time),
for a loaded or shared machine; the page says so.

`--only NAME` runs only those benchmarks and merges them into the page that is there: their
summary rows and sections are replaced (or added, in this file's order), every other
benchmark's are kept as they were, and each replaced section says when and under what load it
was measured, since the page's header describes the run that measured the rest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.figures import (
    Figure,
    Parser,
    parse_checkpoint_speed,
    parse_cli_startup,
    parse_controller_cpu,
    parse_controller_host,
    parse_guard_billing,
    parse_idle_latency,
    parse_spot_recovery,
    parse_team_scale,
    parse_trainer_throughput,
    report_rows,
)
from bench.machine_facts import load_average, machine_facts
from bench.page_merge import merge_pages

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "benchmarks.md"
OUTPUT_TAIL_LINES = 40


@dataclass(frozen=True)
class Benchmark:
    """A benchmark of bench/: how to run it (full and quick) and how to read its summary."""

    name: str  # module name in bench/
    title: str
    baseline: str  # what the baseline is, in words
    parse: Parser
    full_args: tuple[str, ...] = ()
    quick_args: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    command: tuple[str, ...] | None = None  # overrides `python -m bench.<name>` (tests)

    def argv(self, quick: bool) -> list[str]:
        base = list(self.command or (sys.executable, "-m", f"bench.{self.name}"))
        return base + list(self.quick_args if quick else self.full_args)

    def shown_command(self, quick: bool) -> str:
        args = " ".join(self.quick_args if quick else self.full_args)
        return f".venv/bin/python -m bench.{self.name} {args}".rstrip()


@dataclass
class Result:
    benchmark: Benchmark
    command: str
    exit_code: int | None  # None: timed out
    seconds: float
    stdout: str
    stderr: str
    figures: list[Figure] = field(default_factory=list)
    parse_error: str = ""

    @property
    def failed(self) -> bool:
        """No figures to show: it crashed, timed out, or printed nothing readable."""
        return not self.figures

    @property
    def status(self) -> str:
        if self.exit_code is None:
            return f"failed: timed out after {self.benchmark.timeout_s:.0f} s"
        if self.failed:
            return f"failed: exit code {self.exit_code}, no figures"
        if self.exit_code == 0:
            return "ran"
        return f"ran; exit code {self.exit_code} (a target was missed)"


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "cli_startup",
        "Command start-up: `orch --help`, and `orch status` / `orch cost` on 100 jobs",
        "the interpreter importing typer and rich.console, in the same run",
        parse_cli_startup,
        quick_args=("--repeats", "3"),
    ),
    Benchmark(
        "launch_overhead",
        "Launch overhead: nodes up -> every rank started (2 nodes x 2 processes)",
        "one `ssh node torchrun ...` per node by hand, in parallel",
        report_rows("ssh + torchrun by hand"),
        quick_args=("--repeats", "3"),
    ),
    Benchmark(
        "kept_cluster",
        "Time to first step: the next job on a kept cluster (50 MB workdir, 10 s setup)",
        "the same job on fresh nodes, in the same run",
        report_rows("the same job on fresh nodes"),
        quick_args=("--repeats", "3"),
    ),
    Benchmark(
        "sync_speed",
        "Sync of a source tree to the nodes",
        "one raw `rsync -a` over ssh to one node",
        report_rows("raw rsync to 1 node"),
        quick_args=("--files", "1000", "--repeats", "3"),
    ),
    Benchmark(
        "data_uplink",
        "Local data to 4 nodes: a 1 GB dataset over the uplink once, then node to node",
        "the dataset's size (bytes sent, read on the nodes' bridge); one raw `rsync -a` over "
        "ssh of it to one node, alternating with it in the same run (time)",
        parse_checkpoint_speed,
        quick_args=("--repeats", "2"),
    ),
    Benchmark(
        "data_kept",
        "A kept cluster's next job with its bucket data unchanged: the data phase on 3 nodes "
        "(a 2 GB prefix of 32 MB objects from moto's S3 over HTTP)",
        "the cluster's first job, which downloads the whole prefix, in the same run",
        parse_checkpoint_speed,
        quick_args=("--repeats", "2"),
    ),
    Benchmark(
        "fleet_start",
        "Jobs on a fleet of 2 machines the user already has (2 GPUs each): time to every rank "
        "started, and a queued job's start after the blocking job's end",
        "the same 2-node job on new local nodes, alternating in the same run (start); the "
        "target itself, 5 s (queue)",
        parse_checkpoint_speed,
        quick_args=("--repeats", "3", "--queue-repeats", "3"),
    ),
    Benchmark(
        "trainer_throughput",
        "Reference trainer throughput on the CPU",
        "the same runs with 0 DataLoader workers",
        parse_trainer_throughput,
        quick_args=("--repeats", "2"),
    ),
    Benchmark(
        "controller_cpu",
        "CPU a detached controller spends watching a job",
        "`orch status --json` polled at the same interval",
        parse_controller_cpu,
        quick_args=("--seconds", "30"),
    ),
    Benchmark(
        "idle_latency",
        "Idle shutdown latency",
        "the idle_timeout itself (configured, not measured)",
        parse_idle_latency,
        quick_args=("--trials", "2"),
    ),
    Benchmark(
        "spot_recovery",
        "Spot recovery on local nodes",
        "cold start of the same job on fresh nodes, measured in the same trial",
        parse_spot_recovery,
        quick_args=("--trials", "2"),
        timeout_s=2400.0,
    ),
    Benchmark(
        "controller_host",
        "Controller host overhead: submit -> first step and spot recovery through a controller "
        "host (2 nodes x 1 rank, tiny model)",
        "a laptop controller (`orch submit --detach --no-remote`), interleaved in the same trials",
        parse_controller_host,
        quick_args=("--trials", "2"),
    ),
    Benchmark(
        "guard_billing",
        "Billing after the controller dies, with a hung job",
        "the same hung job with no limit, observed over the same window",
        parse_guard_billing,
        quick_args=("--max-runtime", "20"),
    ),
    Benchmark(
        "checkpoint_speed",
        "Checkpoints at real sizes: save to mirror, 2 GB pulls and resumes, store uploads",
        "raw rsync of the same file over the same ssh options; a plain boto3 upload_file; the "
        "same training loop saving where orch does not look",
        parse_checkpoint_speed,
        quick_args=("--repeats", "3", "--saves", "4", "--rate-s", "15", "--upload-mb", "256"),
        timeout_s=2400.0,
    ),
    Benchmark(
        "bucket_data",
        "Bucket to node: `bucket-data fetch` of a 2 GB prefix of 64 MB objects and of 10,000 "
        "objects of 100 KB from moto's S3 over HTTP, and the fetch again with the bucket "
        "unchanged",
        "boto3's transfer manager downloading the same prefix (same concurrency and part size), "
        "alternating with it in the same run; the first fetch for the unchanged one",
        parse_checkpoint_speed,
        quick_args=("--repeats", "3", "--small-repeats", "1"),
        timeout_s=2400.0,
    ),
    Benchmark(
        "checkpoint_capture",
        "Checkpoint capture on a busy node: the share of saves taken of a 16 MB torch.save "
        "rewritten in place every 0.5 s, 1 s and 2 s",
        "the same agent with taking at a look off (the quiet rule alone), watching the same "
        "saves at the same time",
        parse_checkpoint_speed,
        quick_args=("--repeats", "1", "--seconds", "15"),
    ),
    Benchmark(
        "loss_detection",
        "Detection of a node lost without notice while rank 0 saves a checkpoint every second "
        "(2 nodes x 2 processes)",
        "the same job saving no checkpoint, in the same trials",
        parse_checkpoint_speed,
        quick_args=("--trials", "2"),
        timeout_s=2400.0,
    ),
    Benchmark(
        "containers",
        "Containers on local nodes: the start of a 2 x 2 job whose image the nodes have, and "
        "the pull of a 2 GB image to 2 nodes at once",
        "the same job on the bare nodes; one raw `podman pull` to one node with the same "
        "podman settings",
        parse_checkpoint_speed,
        quick_args=("--repeats", "5", "--pulls", "3"),
        timeout_s=2400.0,
    ),
    Benchmark(
        "dashboard_pages",
        "Dashboard pages: `orch dashboard`'s jobs, job, clusters and cost pages and its charts "
        "over HTTP, over 10,000 jobs on SQLite and on PostgreSQL",
        "building `orch status --json`'s document (`report.documents.status_list`) over the "
        "same ledger, in the same run",
        parse_team_scale,
        quick_args=("--quick",),
        timeout_s=1200.0,
    ),
    Benchmark(
        "team_scale",
        "Team scale: 16 detached jobs from 2 homes on one PostgreSQL ledger, `orch status` and "
        "`orch cost` over 10,000 jobs, controller CPU per node at 8, 32 and 64 nodes",
        "one shared SQLite file for the submits; `orch --help` for the read commands; the "
        "per-node CPU at the smallest N",
        parse_team_scale,
        quick_args=("--quick",),
        timeout_s=3600.0,
    ),
)


# --------------------------------------------------------------------------------------------
# Running


def run_benchmark(bench: Benchmark, *, quick: bool) -> Result:
    """Run one benchmark to its end (or its timeout) and read its figures. Never raises for
    the benchmark's own failure."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env = {k: v for k, v in env.items() if k != "ORCH_HOME"}  # each makes its own
    started = time.monotonic()
    try:
        done = subprocess.run(
            bench.argv(quick), cwd=REPO, env=env, capture_output=True, text=True,
            timeout=bench.timeout_s, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        code: int | None = done.returncode
        stdout, stderr = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        stdout = _text(exc.stdout)
        stderr = _text(exc.stderr)
    except OSError as exc:
        code, stdout, stderr = 127, "", f"could not start: {exc}"
    result = Result(
        bench, bench.shown_command(quick), code, time.monotonic() - started, stdout, stderr
    )
    try:
        result.figures = bench.parse(stdout)
    except (ValueError, KeyError) as exc:
        result.parse_error = f"{type(exc).__name__}: {exc}"
    return result


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


# --------------------------------------------------------------------------------------------
# The page


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _load_note(load_before: str, cores: int) -> str:
    """What the load before the run (others' work, none of the benchmarks') says."""
    try:
        busy = float(load_before.split(",")[0]) >= max(1, cores) / 2
    except ValueError:
        return "The machine's load during the run is unknown."
    if busy:
        return (
            f"The machine was shared: other work ran on its {cores} cores during the run (see "
            "the load average), so absolute times are slower and noisier than on an idle one."
        )
    return "The machine was otherwise idle when the run started (see the load average)."


def _met(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "**no**")


def _tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    kept = text.strip("\n").splitlines()[-lines:]
    return "\n".join(kept).replace("```", "'''") or "(nothing)"


def render_page(
    results: list[Result],
    *,
    machine: dict[str, str],
    quick: bool,
    started_at: datetime,
    load_before: str,
    load_after: str,
    section_note: str = "",
) -> str:
    """docs/benchmarks.md: the machine, a summary table, and each benchmark's own summary.
    `section_note`, when given, opens each benchmark's section (a run of some benchmarks
    only, merged into a page whose header is another run's)."""
    cores = os.cpu_count() or 0
    mode = (
        "**quick** (`--quick`: fewer repetitions per benchmark; the commands are below)"
        if quick
        else "full (each benchmark's default repetitions)"
    )
    lines = [
        "# Benchmarks",
        "",
        "<!-- written by `make bench` (bench/run_all.py); edits here are lost -->",
        "",
        f"Measured on {started_at:%Y-%m-%d} ({started_at:%H:%M} UTC), mode: {mode}.",
        "Every figure is a median over the benchmark's repetitions, and each has its baseline",
        "measured in the same run, on the same machine, interleaved with it where the benchmark",
        "allows: the ratio (figure / baseline) is the number to read; absolute figures depend on",
        "the machine and its load.",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {key} | {value} |" for key, value in machine.items()],
        f"| load average (1, 5, 15 min) | before: {load_before}; after: {load_after} |",
        "",
        _load_note(load_before, cores),
        "",
        "## Summary",
        "",
        "| benchmark | figure | measured | baseline | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        if result.failed:
            lines.append(
                f"| [{result.benchmark.name}](#{result.benchmark.name}) | **{result.status}** "
                "| - | - | - | - | - |"
            )
            continue
        for figure in result.figures:
            baseline = (
                f"{_number(figure.baseline)} {figure.unit} ({figure.baseline_name})"
                if figure.baseline is not None
                else "-"
            )
            lines.append(
                f"| [{result.benchmark.name}](#{result.benchmark.name}) | {figure.name} "
                f"| {_number(figure.value)} {figure.unit} | {baseline} "
                f"| {_number(figure.ratio)} | {figure.target or '-'} | {_met(figure.met)} |"
            )
    lines += ["", "## Each benchmark", ""]
    for result in results:
        bench = result.benchmark
        lines += [
            f'<a id="{bench.name}"></a>',
            f"### {bench.title} (`bench/{bench.name}.py`)",
            "",
            *([section_note, ""] if section_note else []),
            f"Baseline: {bench.baseline}. Status: {result.status}; "
            f"{result.seconds:.0f} s of wall time.",
            "",
            "```sh",
            result.command,
            "```",
            "",
            "What it printed:",
            "",
            "```text",
            _tail(result.stdout),
            "```",
            "",
        ]
        if result.failed:
            lines += ["Its error output (last lines):", "", "```text", _tail(result.stderr)]
            lines += ["```", ""]
        if result.parse_error:
            lines += [f"Its summary could not be read: {result.parse_error}", ""]
    lines += [
        "## Reproduce",
        "",
        "```sh",
        "make bench                                      # every benchmark, full; writes this page",
        "make bench BENCH_ARGS=--quick                   # fewer repetitions",
        ".venv/bin/python -m bench.run_all --only sync_speed   # rerun one, keep the rest",
        ".venv/bin/python -m bench.sync_speed --help     # one benchmark and its knobs",
        "```",
        "",
        "The benchmarks start real local nodes (sshd, as root: network namespaces), real rsync and",
        "real torchrun, like the tests. Each prints its own summary; `bench/run_all.py` runs them",
        "one after another, reads the figures from those summaries and writes this page. A",
        "benchmark that fails is reported here and does not stop the others.",
        "",
    ]
    return "\n".join(lines)


def write_page(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def separate_run_note(names: Sequence[str], *, quick: bool, started_at: datetime,
                      load_before: str, load_after: str, commit: str) -> str:  # fmt: skip
    """What a section measured in a run of some benchmarks only says of that run."""
    only = " ".join(f"--only {name}" for name in names)
    mode = "quick" if quick else "full"
    return (
        f"Measured on {started_at:%Y-%m-%d} ({started_at:%H:%M} UTC, {mode} mode) in a run of "
        f"this benchmark alone (`.venv/bin/python -m bench.run_all {only}`), at orch commit "
        f"{commit}, with the load average (1, 5, 15 min) at {load_before} before and "
        f"{load_after} after; the machine section above describes the run of the others."
    )


def run_all(
    benchmarks: tuple[Benchmark, ...] | list[Benchmark],
    *,
    quick: bool,
    out: Path,
    log: Callable[[str], None] = print,
    merge: bool = False,
) -> list[Result]:
    """Run the benchmarks one after another and write the page to `out`; with `merge`, into
    the page already there (`merge_pages`), keeping the other benchmarks' rows and sections."""
    started_at = datetime.now(UTC)
    load_before = load_average()
    results = []
    for bench in benchmarks:
        log(f"running {bench.name}: {bench.shown_command(quick)}")
        result = run_benchmark(bench, quick=quick)
        log(f"  {bench.name}: {result.status} ({result.seconds:.0f} s)")
        results.append(result)
    load_after = load_average()
    machine = machine_facts()
    old = out.read_text(encoding="utf-8") if merge and out.exists() else None
    names = [bench.name for bench in benchmarks]
    note = ""
    if old is not None:
        note = separate_run_note(
            names, quick=quick, started_at=started_at, load_before=load_before,
            load_after=load_after, commit=machine["orch commit"],
        )  # fmt: skip
    page = render_page(
        results,
        machine=machine,
        quick=quick,
        started_at=started_at,
        load_before=load_before,
        load_after=load_after,
        section_note=note,
    )
    if old is not None:
        merged = merge_pages(old, page, names, [b.name for b in BENCHMARKS])
        if merged is None:
            log(f"{out} has another shape: writing this run's page in its place")
        page = merged or render_page(
            results, machine=machine, quick=quick, started_at=started_at,
            load_before=load_before, load_after=load_after,
        )  # fmt: skip
    write_page(out, page)
    log(f"wrote {out}" + (" (merged: the other benchmarks' rows kept)" if old else ""))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--only",
        action="append",
        choices=[b.name for b in BENCHMARKS],
        help="run only these, and merge them into the page (the others' rows are kept)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the page to write")
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    results = run_all(chosen, quick=args.quick, out=args.out, merge=bool(args.only))
    failed = [r.benchmark.name for r in results if r.failed]
    if failed:
        print(f"failed (reported on the page): {', '.join(failed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
