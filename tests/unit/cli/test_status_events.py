"""`orch status JOB` of a job that recovered, long after: its recovery's events and count are
shown however many CHECKPOINT events followed, repeats in one row, and a line says how many
events are left out; `--events all` lists every one. The real `orch status` entry point, in
this process, on ledger rows written directly (`tests.support.ledger_rows`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.ledger.store import Ledger, make_engine
from tests.support.in_process import isolated_home, run_main
from tests.support.ledger_rows import add_recovered_job

JOB = "tutorial-1"
PULLS = 40  # CHECKPOINT events on each side of the recovery


@pytest.fixture
def recovered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    home = isolated_home(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", "200")
    ledger = Ledger(make_engine(home / "orch.db"))
    add_recovered_job(ledger, JOB, pulls=PULLS)
    return ledger


def event_lines(out: str) -> list[str]:
    """The rows of the events table (the lines that start with a time), cells apart by one
    space: `at kind step message`."""
    rows = []
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if re.fullmatch(r"\d\d:\d\d:\d\d", cells[0]):
            rows.append(" ".join(cells))
    return rows


def test_status_of_a_recovered_job_shows_its_recovery_and_its_count(recovered: Ledger) -> None:
    code, out, err = run_main(["status", JOB])
    assert code == 0, out + err
    assert re.search(r"^\s*recoveries\s+1\s*$", out, re.M), out  # the header says it
    rows = event_lines(out)
    kinds = [row.split()[1] for row in rows]
    for kind in ("PREEMPTED", "SALVAGED", "RECOVERING", "RESUMED", "SUCCEEDED"):
        assert kind in kinds, out
    assert kinds.index("PREEMPTED") < kinds.index("SALVAGED") < kinds.index("RECOVERING")
    assert kinds.index("RECOVERING") < kinds.index("RESUMED")
    (salvaged,) = [row for row in rows if row.split()[1] == "SALVAGED"]
    assert "snapshot.pt (pulled at step 195" in salvaged, salvaged
    # each run of pulls is one row that counts them and names the newest
    pulled = [row for row in rows if row.split()[1] == "CHECKPOINT"]
    assert len(pulled) == 2, out
    assert f"{PULLS} checkpoints pulled since 09:00:40" in pulled[0], pulled
    assert "the newest snapshot.pt at step 195" in pulled[0], pulled
    assert len(rows) <= 15 + 2, out
    # the snapshot's record says the step the run had reported when it was pulled
    assert re.search(r"│ snapshot\.pt\s+│ 395\s+│ 4096\s+│", out), out


def test_a_note_counts_the_events_left_out_and_events_all_lists_them(recovered: Ledger) -> None:
    everything = len(recovered.events(JOB))
    code, out, err = run_main(["status", JOB, "--events", "3"])
    assert code == 0, out + err
    rows = event_lines(out)
    kinds = [row.split()[1] for row in rows]
    assert {"PREEMPTED", "SALVAGED", "RECOVERING", "RESUMED"} <= set(kinds), out
    assert kinds.count("CHECKPOINT") == 1, out  # the older run of pulls is left out ...
    shown = sum(PULLS if kind == "CHECKPOINT" else 1 for kind in kinds)
    note = re.search(
        r"(\d+) earlier event\(s\) not shown: orch status tutorial-1 --events all", out
    )
    assert note is not None, out
    assert int(note.group(1)) == PULLS == everything - shown  # ... and counted

    code, out, err = run_main(["status", JOB, "--events", "all"])
    assert code == 0, out + err
    assert len(event_lines(out)) == everything
    assert "not shown" not in out


def test_json_keeps_every_event(recovered: Ledger) -> None:
    code, out, err = run_main(["status", JOB, "--json"])
    assert code == 0, out + err
    document = json.loads(out)
    assert len(document["events"]) == len(recovered.events(JOB))
    assert document["recoveries"] == 1


@pytest.mark.parametrize(
    "argv",
    [["status", "--events", "all"], ["status", JOB, "--json", "--events", "all"]],
)
def test_events_goes_with_one_jobs_view(recovered: Ledger, argv: list[str]) -> None:
    code, out, err = run_main(argv)
    assert code == 2, out + err
    assert "--events goes with one job's view" in out + err


def test_a_bad_events_value_is_a_usage_error(recovered: Ledger) -> None:
    code, out, err = run_main(["status", JOB, "--events", "some"])
    assert code == 2, out + err
    assert "`all` or a number of rows" in out + err
