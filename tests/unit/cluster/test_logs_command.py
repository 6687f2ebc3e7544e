"""`orch logs` for programs: --tail, --since (on the times the controller pulled the lines),
--json and --all-ranks, on a real ledger and real mirrored logs (`cluster.log_files`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.cluster import log_files
from orchestrator.config import Settings
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine
from tests.support.in_process import isolated_home, run_main

EARLY = datetime.now(UTC) - timedelta(hours=2)
LATE = datetime.now(UTC) - timedelta(minutes=1)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = isolated_home(tmp_path, monkeypatch)
    ledger = Ledger(make_engine(home / "orch.db"))
    ledger.add_job(
        Job(
            id="j-1", name="j", provider="local", nodes=2, gpus_per_node=2, spec_json="{}",
            spec_path="job.yaml", created_at=EARLY, state=JobState.SUCCEEDED.value,
        )
    )  # fmt: skip
    logs = Settings(home=home).job_dir("j-1") / "logs"
    logs.mkdir(parents=True)
    pulls = {
        0: [
            (EARLY, "[default0]:r0 a\n[default1]:r1 a\n[default0]:r0 b\n"),
            (LATE, "[default0]:r0 c\n"),
        ],
        1: [(EARLY, "torchrun starting\n[default0]:r2 a\n"), (LATE, "[default1]:r3 a\n")],
    }  # fmt: skip
    for node, chunks in pulls.items():
        for at, text in chunks:
            log_files.append(
                logs / f"node-{node}.log", text.encode(), max_bytes=0, keep=1, pulled_at=at
            )
    return home


def lines(*args: str) -> list[str]:
    code, out, err = run_main(["logs", "j-1", *args])
    assert code == 0, err
    return out.splitlines()


def test_tail_keeps_the_last_lines_of_the_selection(home: Path) -> None:
    assert lines() == ["r0 a", "r0 b", "r0 c"]
    assert lines("--tail", "2") == ["r0 b", "r0 c"]
    assert lines("--tail", "0") == []
    assert lines("--tail", "9", "--rank", "3") == ["r3 a"]


def test_since_takes_a_duration_or_an_iso_time_of_the_pulls(home: Path) -> None:
    assert lines("--since", "1h") == ["r0 c"]
    assert lines("--since", "3h") == ["r0 a", "r0 b", "r0 c"]
    naive_utc = (EARLY + timedelta(minutes=30)).replace(tzinfo=None).isoformat()
    assert lines("--since", naive_utc) == ["r0 c"]
    assert lines("--since", (LATE + timedelta(seconds=1)).isoformat()) == []
    code, _, err = run_main(["logs", "j-1", "--since", "yesterday"])
    assert code == 2 and "--since" in err


def test_json_gives_one_object_per_line(home: Path) -> None:
    objects = [json.loads(line) for line in lines("--json", "--node", "1")]
    assert objects == [
        {"node": 1, "rank": None, "line": "torchrun starting", "time": EARLY.isoformat()},
        {"node": 1, "rank": 2, "line": "r2 a", "time": EARLY.isoformat()},
        {"node": 1, "rank": 3, "line": "r3 a", "time": LATE.isoformat()},
    ]


def test_all_ranks_prefixes_every_line_with_its_rank_in_pull_order(home: Path) -> None:
    assert lines("--all-ranks") == [
        "[rank 0] r0 a", "[rank 1] r1 a", "[rank 0] r0 b",
        "[node 1] torchrun starting", "[rank 2] r2 a",
        "[rank 0] r0 c", "[rank 3] r3 a",
    ]  # fmt: skip
    assert lines("--all-ranks", "--tail", "2", "--since", "1h") == [
        "[rank 0] r0 c",
        "[rank 3] r3 a",
    ]
    code, _, err = run_main(["logs", "j-1", "--all-ranks", "--rank", "1"])
    assert code == 2 and "--all-ranks" in err
