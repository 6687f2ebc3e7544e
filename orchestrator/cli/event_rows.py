"""What `orch status JOB` shows of a job's events: repeated events collapsed, every state change
kept, and how many were left out. Pure: rows from the events of a status document.

- A run of CHECKPOINT events in a row is one row: "12 checkpoints pulled since 10:02:13, the
  newest snapshot.pt at step 250" (a coalesced event counts the versions it stands for,
  `pulled_events.versions_in`).
- A run of other events of one kind with one text is one row with "(x N)".
- The newest `limit` rows are shown, and before them every state change and every event of
  a recovery, a move or a take-over (`LANDMARKS`). The events of the rows left out are
  counted.

`--json` keeps the whole list; `orch status JOB --events all` shows every event as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.cluster.checkpoints.pulled_events import name_in, since_in, versions_in
from orchestrator.job_state import JobState

LANDMARKS = frozenset(
    {state.value for state in JobState}
    | {"PREEMPTED", "SALVAGED", "RESUMED", "SET_ASIDE", "FALLBACK", "START_FAILED", "SWITCHED"}
    | {"ADOPTED", "RESTARTED", "REBUILT"}
)
COLLAPSED = "CHECKPOINT"  # a run of these is one row however their texts differ

Event = Mapping[str, Any]  # a status document's event: at (ISO), kind, message, step


@dataclass(frozen=True)
class EventRow:
    """One line of the events table: `events` ledger events, the newest at `at`."""

    at: str  # ISO time of the newest event it stands for
    kind: str
    step: int | None
    message: str  # one line
    events: int = 1


def first_line(message: str | None) -> str:
    return message.splitlines()[0] if message else ""


def as_row(event: Event) -> EventRow:
    return EventRow(event["at"], event["kind"], event["step"], first_line(event["message"]))


def collapse(events: Sequence[Event]) -> list[EventRow]:
    """The events in order, each run of repeats one row (see the module docstring); a
    landmark is never folded into another row."""
    rows: list[EventRow] = []
    run: list[Event] = []
    for event in events:
        if run and not _same_run(run[-1], event):
            rows.append(_row(run))
            run = []
        run.append(event)
    if run:
        rows.append(_row(run))
    return rows


def shown(events: Sequence[Event], limit: int) -> tuple[list[EventRow], int]:
    """The rows to show (`collapse`): the newest `limit`, and every landmark before them;
    and how many events the rows left out stood for."""
    rows = collapse(events)
    keep_from = len(rows) - limit
    kept, left_out = [], 0
    for index, row in enumerate(rows):
        if index >= keep_from or row.kind in LANDMARKS:
            kept.append(row)
        else:
            left_out += row.events
    return kept, left_out


def _same_run(last: Event, event: Event) -> bool:
    if event["kind"] != last["kind"] or event["kind"] in LANDMARKS:
        return False
    return event["kind"] == COLLAPSED or first_line(event["message"]) == first_line(last["message"])


def _row(run: list[Event]) -> EventRow:
    newest = run[-1]
    if len(run) == 1:
        return as_row(newest)
    if newest["kind"] == COLLAPSED:
        text = _checkpoints_text(run)
    else:
        text = f"{first_line(newest['message'])} (x {len(run)})"
    return EventRow(newest["at"], newest["kind"], newest["step"], text, len(run))


def _checkpoints_text(run: list[Event]) -> str:
    """`12 checkpoints pulled and 3 stored since 10:02:13, the newest snapshot.pt at step 250`."""
    counts = {"pulled": 0, "stored": 0}
    for event in run:
        message = first_line(event["message"])
        how = message.partition(" ")[0]
        counts[how if how in counts else "pulled"] += versions_in(message)
    (n, how), *more = [(n, how) for how, n in counts.items() if n]
    since = since_in(first_line(run[0]["message"])) or run[0]["at"][11:19]
    text = f"{n} checkpoints {how}" + "".join(f" and {n} {how}" for n, how in more)
    text += f" since {since}"
    newest = run[-1]
    name = name_in(first_line(newest["message"]))
    if name is not None:
        text += f", the newest {name}"
        if newest["step"] is not None:
            text += f" at step {newest['step']}"
    return text
