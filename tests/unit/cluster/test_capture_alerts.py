"""A checkpoint file going without a copy is never silence: the agent's manifest says so, the
controller writes one WARNING event for it and `orch status JOB` shows a line until a copy is
taken again (a CAPTURED event)."""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

from orchestrator.cli.console import job_detail
from orchestrator.cluster.checkpoints.capture_alerts import (
    CaptureAlerts,
    active_alerts,
    duration_text,
)
from orchestrator.config import Settings
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.node.checkpoint_protocol import AgentReport, parse_manifest
from orchestrator.report.documents import job_document
from tests.support.agent_dirs import make_agent
from tests.support.waiting import wait_until

NOW = datetime(2026, 12, 6, 12, 7, 10, tzinfo=UTC)


def report(
    rank: int, uncaptured: dict, files: dict | None = None, offset_ns: int = 0
) -> AgentReport:
    document = {"version": 1, "generation": 3, "files": files or {}, "uncaptured": uncaptured}
    manifest = parse_manifest(document, rank, clock_offset_ns=offset_ns)
    assert manifest is not None
    return AgentReport("alive", manifest)


def since(seconds_ago: float) -> int:
    return int((NOW - timedelta(seconds=seconds_ago)).timestamp() * 1e9)


def test_a_file_going_without_a_copy_is_one_warning_until_it_is_captured_again() -> None:
    events: list[tuple[str, str]] = []
    alerts = CaptureAlerts(lambda kind, text: events.append((kind, text)))
    going = {"snapshot.pt": {"every_s": 1.5, "since_ns": since(240), "ever": False}}
    alerts.update({0: report(0, going)}, now=NOW)
    alerts.update({0: report(0, going)}, now=NOW + timedelta(seconds=30))  # still: said once
    assert len(events) == 1
    kind, text = events[0]
    assert kind == "WARNING"
    assert "node 0: snapshot.pt rewritten every 1.5 s, never captured for 4 min" in text
    assert "(since 12:03:10 UTC)" in text
    assert active_alerts(events) == [
        "node 0: snapshot.pt rewritten every 1.5 s, never captured for 4 min (since 12:03:10 UTC)"
    ]

    alerts.update({}, now=NOW + timedelta(seconds=60))  # node 0 did not answer: no news
    assert len(events) == 1
    staged = {"digest": "ab" * 32, "size": 4, "mtime_ns": 1, "object": "cd" * 32}
    taken = {"snapshot.pt": {"size": 4, "mtime_ns": 1, "staged": staged}}
    alerts.update({0: report(0, {}, taken)}, now=NOW + timedelta(seconds=90))
    assert events[-1] == (
        "CAPTURED",
        "node 0: snapshot.pt captured again, after 6 min without a copy",
    )
    assert active_alerts(events) == []


def test_the_node_clock_is_taken_into_account_and_alerts_are_per_node_and_file() -> None:
    events: list[tuple[str, str]] = []
    alerts = CaptureAlerts(lambda kind, text: events.append((kind, text)))
    ahead = 3600 * 10**9  # node 1's clock runs an hour ahead
    going = {"a.pt": {"every_s": 2, "since_ns": since(60) + ahead, "ever": True}}
    alerts.update({0: report(0, going), 1: report(1, going, offset_ns=ahead)}, now=NOW)
    assert [text.split(" (since")[0] for _, text in events] == [
        f"checkpoints not captured: node {rank}: a.pt rewritten every 2 s, none captured for "
        f"{'60 s' if rank == 1 else '0 s'}"
        for rank in (0, 1)
    ]  # node 0's word, read without its offset, is in the future: no time went by
    alerts.update({1: report(1, {})}, now=NOW)  # a.pt is gone from node 1
    assert events[-1] == ("CAPTURED", "node 1: a.pt no longer there, after 60 s without a copy")
    assert len(active_alerts(events)) == 1


def test_a_manifest_s_uncaptured_entries_are_checked() -> None:
    bad = {
        "../x.pt": {"every_s": 1, "since_ns": 1},  # not a path under the directory
        "nl\n.pt": {"every_s": 1, "since_ns": 1},
        "nan.pt": {"every_s": float("nan"), "since_ns": 1},
        "neg.pt": {"every_s": -1, "since_ns": 1},
        "str.pt": {"every_s": "1", "since_ns": 1},
        "no-since.pt": {"every_s": 1},
        "list.pt": [1, 2],
    }
    manifest = report(0, {**bad, "ok.pt": {"every_s": 0.5, "since_ns": 7}}).manifest
    assert manifest is not None and list(manifest.uncaptured) == ["ok.pt"]
    many = {f"f{i:03d}.pt": {"every_s": 1, "since_ns": 1} for i in range(500)}
    assert len(report(0, many).manifest.uncaptured) == 20  # type: ignore[union-attr]


def test_durations_read_as_people_say_them() -> None:
    assert [duration_text(s) for s in (4, 89, 240, 5000, 9000)] == [
        "4 s", "89 s", "4 min", "83 min", "2.5 h"
    ]  # fmt: skip


def test_status_shows_the_line_while_the_job_runs(tmp_path: Path) -> None:
    """From the agent's own manifest to `orch status JOB`: the agent (here, in this process)
    sees a file rewritten nonstop that it cannot take, the controller's alerts write the
    event, and the job's detail view shows the line, gone once the job has ended."""
    agent = make_agent(tmp_path, job_id="j-1", quiet_s=30.0, uncaptured_min_s=0.3)
    stop = threading.Event()

    def rewrite() -> None:
        n = 0
        while not stop.wait(0.05):
            n += 1
            (tmp_path / "ckpt" / "state.bin").write_bytes(bytes([n % 251]) * 100)

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:

        def uncaptured() -> bool:
            if agent.uncaptured:
                return True
            agent.pass_once(ended=False)
            return False

        wait_until(uncaptured, "the file uncaptured", 10, interval=0.05)
    finally:
        stop.set()
        writer.join()
    agent.write_manifest(done=False)
    document = json.loads((tmp_path / "state" / "manifest.json").read_text())

    ledger = Ledger(make_engine(":memory:"))
    ledger.add_job(Job(id="j-1", name="j", provider="local", nodes=1, gpus_per_node=1,
                       spec_json="{}", spec_path="job.yaml", created_at=NOW))  # fmt: skip
    ledger.update_job("j-1", state=JobState.RUNNING)
    alerts = CaptureAlerts(lambda kind, text: ledger.add_event("j-1", kind, text))
    alerts.update({0: AgentReport("alive", parse_manifest(document, 0))})
    doc = job_document(ledger, Settings(home=tmp_path / "home"), ledger.get_job("j-1"))
    (line,) = doc["checkpoint_alerts"]
    assert line.startswith("node 0: state.bin rewritten every ")
    assert [e["kind"] for e in doc["events"]] == ["WARNING"]
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    for renderable in job_detail(doc):
        console.print(renderable)
    assert f"checkpoints  {line}" in out.getvalue()

    ledger.update_job("j-1", state=JobState.SUCCEEDED)
    ended = job_document(ledger, Settings(home=tmp_path / "home"), ledger.get_job("j-1"))
    assert ended["checkpoint_alerts"] == []
