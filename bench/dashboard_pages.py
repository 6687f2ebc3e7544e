"""Dashboard pages at team scale: how long `orch dashboard` takes to answer each page over a
ledger of 10,000 jobs, on SQLite and on PostgreSQL, in the same run.

What it measures (every figure a median of N requests after one warm-up request):

- The ledger: `bench.team_seed`'s jobs (a mix of final states over six months, owner labels,
  leases with recoveries, events, checkpoints; the newest few RUNNING with GPU readings every
  30 s of every node and GPU and a progress row every 10 s) written into a new SQLite file and
  into a database of a throwaway PostgreSQL server (initdb/pg_ctl on 127.0.0.1).
- The server: `orch dashboard --port 0 --bind 127.0.0.1` as a child process (the command a user
  runs: uvicorn serving the Starlette app), its ORCH_HOME naming that ledger.
- The requests: real HTTP/1.1 GETs from this process over one kept-alive connection to
  127.0.0.1, each timed from the request's send to the last byte of the answer (the server's
  work plus a loopback round trip): the jobs page `/`, a filtered jobs page
  (`/?state=FAILED&owner=...&name=...`), the RUNNING job with the most GPU readings `/jobs/ID`
  and its live part `/jobs/ID/live`, the clusters page, the cost page, and one chart SVG of
  each kind (the job's gpu, memory, progress and spend panels; the month's daily and
  burn-down charts). A page that does not answer 200 is reported as not measured.
- The baseline, in the same run on the same ledger: building `orch status --json`'s document
  (`report.documents.status_list` over a `LedgerView`) in this process, so the ratio says what
  a page adds to the list the command prints.

Target: the jobs pages and the job page (and its live part) under 300 ms on both databases.

    .venv/bin/python -m bench.dashboard_pages [--quick] [--jobs 10000] [--repeats 15]
        [--only sqlite,postgresql]

`--quick` takes 7 requests per page (10,000 jobs still). The PostgreSQL server binaries
(Debian's `postgresql`) must be installed.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, median  # noqa: E402
from bench.team_scale import ORCH, make_home, orch_env  # noqa: E402
from bench.team_seed import Seed, seed_rows, write_seed  # noqa: E402

PAGE_TARGET_S = 0.3
BASELINE_NAME = "orch status --json's document"
LISTENING = re.compile(r"^dashboard: (http://\S+)$", re.MULTILINE)
JOB_PANELS = ("gpu", "memory", "progress", "spend")
COST_CHARTS = ("daily", "burndown")


@dataclass(frozen=True)
class Page:
    """One request the benchmark times: its label, its path, and whether the target holds it."""

    label: str
    path: str
    targeted: bool


def pages_of(rows: Seed) -> list[Page]:
    """What to time over the ledger seeded with `rows`: the job is the RUNNING one with the
    most GPU readings, the filter one state, one owner and a part of a name some jobs have."""
    live = {job["id"] for job in rows.jobs if job["state"] == "RUNNING"}
    counts = {job_id: 0 for job_id in live}
    for sample in rows.gpu_samples:
        counts[sample["job_id"]] = counts.get(sample["job_id"], 0) + 1
    job = max(sorted(counts), key=lambda job_id: counts[job_id])
    failed = next(j for j in reversed(rows.jobs) if j["state"] == "FAILED" and j["owner"])
    query = urlencode({"state": "FAILED", "owner": failed["owner"], "name": failed["name"][:3]})
    return [
        Page("jobs page /", "/", True),
        Page(f"jobs page /?{query}", f"/?{query}", True),
        Page(f"job page /jobs/ID ({counts[job]} GPU readings)", f"/jobs/{job}", True),
        Page("job live part /jobs/ID/live", f"/jobs/{job}/live", True),
        Page("clusters page /clusters", "/clusters", False),
        Page("cost page /cost", "/cost", False),
        *(Page(f"job chart {p}.svg", f"/jobs/{job}/charts/{p}.svg", False) for p in JOB_PANELS),
        *(Page(f"cost chart {c}.svg", f"/cost/charts/{c}.svg", False) for c in COST_CHARTS),
    ]


# --------------------------------------------------------------------------------------------
# The server and the requests


class DashboardServer:
    """`orch dashboard --port 0 --bind 127.0.0.1` over `home`'s ledger, until `stop()`."""

    def __init__(self, home: Path, timeout_s: float = 60.0) -> None:
        self.process = subprocess.Popen(
            [str(ORCH), "dashboard", "--port", "0", "--bind", "127.0.0.1"],
            env=orch_env(home, PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self.output: list[str] = []
        listening = threading.Event()
        self.url = ""

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if found := LISTENING.match(line.strip()):
                    self.url = found.group(1)
                    listening.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not listening.wait(timeout_s):
            self.stop()
            raise RuntimeError(f"orch dashboard did not listen: {''.join(self.output)[-2000:]}")
        address = self.url.removeprefix("http://").rstrip("/")
        self.host, _, port = address.rpartition(":")
        self.port = int(port)

    def stop(self) -> int:
        """SIGTERM, then its exit code (the contract: 0)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._reader.join(timeout=5)
        return code


def get(connection: http.client.HTTPConnection, path: str) -> tuple[float, int, bytes]:
    """One GET over the kept-alive `connection`: seconds to the answer's last byte, status,
    body."""
    started = time.perf_counter()
    connection.request("GET", path)
    answer = connection.getresponse()
    body = answer.read()
    return time.perf_counter() - started, answer.status, body


def time_page(
    connection: http.client.HTTPConnection, page: Page, repeats: int
) -> tuple[float | None, str]:
    """The median seconds of `repeats` GETs of `page` after a warm-up one, or None and why
    when the warm-up does not answer 200 (the connection is then opened again)."""
    try:
        _, status, body = get(connection, page.path)
    except (http.client.HTTPException, OSError) as exc:
        connection.close()
        return None, f"no answer: {type(exc).__name__}: {exc}"
    if status != 200:
        connection.close()  # a server may close it after an error: the next request reopens
        return None, f"answered {status}: {body[:200].decode(errors='replace').strip()}"
    return median([get(connection, page.path)[0] for _ in range(repeats)]), ""


def time_baseline(engine: object, home: Path, repeats: int) -> float:
    """The median seconds of building `orch status --json`'s list over a new `LedgerView`."""
    from orchestrator.ledger.view import LedgerView
    from orchestrator.report.documents import status_list

    def once() -> float:
        started = time.perf_counter()
        with LedgerView.of_engine(engine) as view:
            status_list(view, home, datetime.now(UTC))
        return time.perf_counter() - started

    once()
    return median([once() for _ in range(repeats)])


# --------------------------------------------------------------------------------------------
# One database


@dataclass
class Measured:
    seeded_s: float
    baseline_s: float
    seconds: dict[str, float | None]
    notes: dict[str, str]
    exit_code: int


def measure(
    root: Path, url: str | None, kind: str, rows: Seed, pages: list[Page], repeats: int
) -> Measured:
    """Seed the ledger at `url` (None: the SQLite file of a new home), time the baseline,
    then every page through a dashboard serving it."""
    from orchestrator.ledger.store import make_engine

    home = make_home(root, f"{kind}-dashboard", url)
    engine = make_engine(url or home / "orch.db")
    started = time.perf_counter()
    write_seed(engine, rows)
    seeded = time.perf_counter() - started
    baseline = time_baseline(engine, home, repeats)
    engine.dispose()
    seconds: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    server = DashboardServer(home)
    try:
        connection = http.client.HTTPConnection(server.host, server.port, timeout=120)
        try:
            for page in pages:
                mark = len(server.output)
                seconds[page.label], notes[page.label] = time_page(connection, page, repeats)
                if notes[page.label]:
                    time.sleep(0.3)  # the server logs its error as it answers
                    said = _last_error(server.output[mark:])
                    notes[page.label] += f" (the server said: {said})"
        finally:
            connection.close()
    finally:
        code = server.stop()
    return Measured(seeded, baseline, seconds, notes, code)


def _last_error(output: list[str]) -> str:
    errors = [line.strip() for line in output if re.match(r"^\w*(Error|Exception)\b", line)]
    return errors[-1][:200] if errors else "nothing"


# --------------------------------------------------------------------------------------------
# Printing


def page_row(name: str, value: float, baseline: float, target: str, met: bool | None) -> str:
    """One figure line in seconds (to the tenth of a millisecond), its baseline, their ratio and
    the target's verdict: the shape `bench.figures.parse_team_scale` reads."""
    verdict = "-" if met is None else ("met" if met else "NOT met")
    return (
        f"  {name:<44} {value:9.4f} s   baseline {baseline:9.4f} s ({BASELINE_NAME})   "
        f"ratio {value / baseline:6.2f}   target {target}: {verdict}"
    )


def verdicts(kind: str, jobs: int, measured: Measured, pages: list[Page]) -> tuple[list[str], bool]:
    """The summary rows of one database and whether its targets are met."""
    lines: list[str] = []
    ok = True
    for page in pages:
        value = measured.seconds.get(page.label)
        name = f"{page.label}, {jobs} jobs, {kind}"
        if value is None:
            ok &= not page.targeted
            lines.append(f"  {name}: not measured: {measured.notes.get(page.label)}")
            continue
        met = value < PAGE_TARGET_S if page.targeted else None
        ok &= met is not False
        target = f"< {PAGE_TARGET_S:g} s" if page.targeted else "-"
        lines.append(page_row(name, value, measured.baseline_s, target, met))
    if measured.exit_code != 0:  # not a figure of this benchmark, but worth a word
        lines.append(f"  note: orch dashboard on {kind} exited {measured.exit_code} on SIGTERM")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="7 requests per page")
    parser.add_argument("--jobs", type=int, default=10000, help="jobs seeded [10000]")
    parser.add_argument("--repeats", type=int, default=None, help="requests per page [15]")
    parser.add_argument("--only", default="sqlite,postgresql", help="comma-separated ledgers")
    args = parser.parse_args(argv)
    repeats = args.repeats or (7 if args.quick else 15)
    kinds = [kind for kind in ("sqlite", "postgresql") if kind in args.only.split(",")]
    rows = seed_rows(args.jobs, datetime.now(UTC))
    pages = pages_of(rows)
    lines: list[str] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="orch-bench-dashboard-") as tmp:
        stop: Callable[[], None] = lambda: None  # noqa: E731
        try:
            for kind in kinds:
                url = None
                if kind == "postgresql":
                    from tests.support.postgres import start_server

                    server = start_server()
                    stop = server.stop
                    url = server.fresh_database("dashboard")
                measured = measure(Path(tmp), url, kind, rows, pages, repeats)
                print(f"  seeded {args.jobs} jobs on {kind} in {measured.seeded_s:.1f} s",
                      flush=True)  # fmt: skip
                found, met = verdicts(kind, args.jobs, measured, pages)
                lines += found
                ok &= met
        finally:
            stop()
    print(
        f"\ndashboard pages (machine: {machine()}; medians of {repeats} requests to orch "
        f"dashboard, a child process, over HTTP on 127.0.0.1; load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())})"
    )
    for line in lines:
        print(line)
    print(f"  targets: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
