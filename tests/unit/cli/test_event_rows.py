"""What `orch status JOB` makes of a job's events (`cli.event_rows`): runs of repeats in one row,
no state change ever folded or left out, and the counts adding up to the events there were."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli.event_rows import LANDMARKS, collapse, shown


def event(second: int, kind: str, message: str = "", step: int | None = None) -> dict:
    return {"at": f"2026-12-06T10:{second // 60:02d}:{second % 60:02d}+00:00", "kind": kind,
            "message": message, "step": step}  # fmt: skip


KINDS = ["CHECKPOINT", "WARNING", "LAUNCHED", "PREEMPTED", "SALVAGED", "RUNNING", "RECOVERING"]
MESSAGES = ["pulled snapshot.pt (10 bytes)", "stored step-000004 to file:///s (5 bytes)", "a", ""]
events_lists = st.lists(
    st.tuples(st.sampled_from(KINDS), st.sampled_from(MESSAGES)), max_size=60
).map(lambda pairs: [event(i, kind, text, i) for i, (kind, text) in enumerate(pairs)])


@given(events_lists)
def test_collapsing_keeps_every_state_change_in_order_and_every_event_counted(
    events: list[dict],
) -> None:
    rows = collapse(events)
    assert sum(row.events for row in rows) == len(events)
    landmarks = [(e["at"], e["kind"]) for e in events if e["kind"] in LANDMARKS]
    assert [(r.at, r.kind) for r in rows if r.kind in LANDMARKS] == landmarks
    assert all(row.events == 1 for row in rows if row.kind in LANDMARKS)
    assert [row.at for row in rows] == sorted(row.at for row in rows)  # in order
    for before, after in zip(rows, rows[1:], strict=False):  # a run is never split in two
        assert (
            before.kind != after.kind
            or before.kind in LANDMARKS
            or (before.kind != "CHECKPOINT" and before.message.split(" (x ")[0] != after.message)
        )


@given(events_lists, st.integers(min_value=1, max_value=20))
def test_the_view_shows_the_newest_rows_and_every_state_change_and_counts_the_rest(
    events: list[dict], limit: int
) -> None:
    rows, left_out = shown(events, limit)
    every = collapse(events)
    assert sum(row.events for row in rows) + left_out == len(events)
    assert rows[-limit:] == every[-limit:] if every else rows == []
    assert [r for r in every if r.kind in LANDMARKS] == [r for r in rows if r.kind in LANDMARKS]


def test_a_run_of_pulls_is_one_row_counting_the_versions_of_coalesced_events() -> None:
    events = [
        event(0, "RUNNING"),
        event(10, "CHECKPOINT", "pulled snapshot.pt (4096 bytes)", 3),
        event(70, "CHECKPOINT", "pulled snapshot.pt (4096 bytes; 57 versions since 10:00:10)", 60),
        event(80, "CHECKPOINT", "stored snapshot.pt to s3://b/p (4096 bytes)", 60),
        event(90, "PREEMPTED", "lost: node 0"),
    ]
    rows = collapse(events)
    assert [row.kind for row in rows] == ["RUNNING", "CHECKPOINT", "PREEMPTED"]
    assert rows[1].message == (
        "58 checkpoints pulled and 1 stored since 10:00:10, the newest snapshot.pt at step 60"
    )
    assert (rows[1].events, rows[1].at, rows[1].step) == (3, events[3]["at"], 60)


def test_a_lone_event_is_shown_as_it_is_and_identical_repeats_are_counted() -> None:
    events = [
        event(0, "CHECKPOINT", "pulled step-000010 (12 bytes)\nsecond line", 10),
        event(1, "WARNING", "store cleanup: denied"),
        event(2, "WARNING", "store cleanup: denied"),
        event(3, "WARNING", "another"),
        event(4, "SALVAGED", "newest checkpoint step-000010 (step 10, 2 s old)"),
        event(5, "SALVAGED", "newest checkpoint step-000010 (step 10, 2 s old)"),
    ]
    assert [(row.kind, row.message) for row in collapse(events)] == [
        ("CHECKPOINT", "pulled step-000010 (12 bytes)"),
        ("WARNING", "store cleanup: denied (x 2)"),
        ("WARNING", "another"),
        ("SALVAGED", "newest checkpoint step-000010 (step 10, 2 s old)"),
        ("SALVAGED", "newest checkpoint step-000010 (step 10, 2 s old)"),
    ]
