"""How often a single file saved in place gets a CHECKPOINT event (`pulled_events.PullThrottle`):
its first version at once, then at most one a minute counting the versions since, what is
held written at a run's end; and the event texts read back as written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.cluster.checkpoints.pulled_events import (
    Arrival,
    PullThrottle,
    name_in,
    since_in,
    versions_in,
)

T0 = datetime(2026, 12, 6, 10, 2, 13, tzinfo=UTC)


def snapshot(step: int, how: str = "pulled") -> Arrival:
    return Arrival(how, "snapshot.pt", 4096, step, "s3://b/p")


def test_a_file_saved_every_second_is_an_event_a_minute_and_its_newest_version_at_the_end() -> None:
    throttle = PullThrottle(every_s=60)
    written = []
    for second in range(150):  # a version pulled every second for 2.5 minutes
        due = throttle.offer(snapshot(second), T0 + timedelta(seconds=second))
        if due is not None:
            written.append(due.message)
    assert written == [
        "pulled snapshot.pt (4096 bytes)",
        "pulled snapshot.pt (4096 bytes; 60 versions since 10:02:13)",
        "pulled snapshot.pt (4096 bytes; 60 versions since 10:03:13)",
    ]
    (held,) = throttle.flush()  # the run ends: the newest version's event
    assert held.arrival.step == 149
    assert held.message == "pulled snapshot.pt (4096 bytes; 29 versions since 10:04:13)"
    assert throttle.flush() == []
    # the next run's first version is an event at once
    assert throttle.offer(snapshot(150), T0 + timedelta(seconds=151)) is not None


def test_files_and_arrivals_are_throttled_apart() -> None:
    throttle = PullThrottle(every_s=60)
    assert throttle.offer(snapshot(1), T0) is not None
    assert throttle.offer(snapshot(1, "stored"), T0) is not None  # the store's copy, apart
    other = Arrival("pulled", "last.ckpt", 10, 1)
    assert throttle.offer(other, T0 + timedelta(seconds=1)) is not None
    assert throttle.offer(snapshot(2), T0 + timedelta(seconds=2)) is None


@example("pulled", "a to b (1 bytes)", 3, 1)
@example("stored", "a to b (1 bytes; 2 versions since 10:00:00)", 3, 2)
@given(
    st.sampled_from(["pulled", "stored"]),
    st.text(st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1).filter(
        lambda s: s == s.strip()
    ),
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=1, max_value=10**6),
)
def test_an_event_text_reads_back_its_name_and_count(
    how: str, name: str, size: int, versions: int
) -> None:
    arrival = Arrival(how, name, size, None, "s3://bucket/prefix")
    message = arrival.message(versions, T0)
    assert name_in(message) == name
    assert versions_in(message) == versions
    assert since_in(message) == ("10:02:13" if versions > 1 else None)
