"""What the controller takes from `bucket-data`'s lines: counts bounded, messages cut, anything
else kept only as the node's own output."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.node.bucket_lines import MAX_MESSAGE, MAX_OTHER_LINES, BucketLines, count


def fed(*lines: object) -> BucketLines:
    state = BucketLines()
    for line in lines:
        state.feed(line if isinstance(line, str) else json.dumps(line))
    return state


def test_a_whole_fetch_is_read_in_order() -> None:
    state = fed(
        {"listing": {"objects": 41, "bytes": 2_000_000}},
        {"plan": {"fetch": 2, "fetch_bytes": 130_000, "keep": 39, "remove": 1}},
        {"progress": {"bytes": 60_000, "total": 130_000, "objects": 1, "of": 2}},
        {"done": {"objects": 41, "fetched": 2, "bytes": 130_000, "kept": 39, "removed": 1,
                  "seconds": 0.4}},
    )  # fmt: skip
    assert (state.objects, state.listed_bytes, state.to_fetch, state.kept) == (41, 2_000_000, 2, 39)
    assert state.total == 130_000 and state.bytes_done == 130_000
    assert state.done == {"objects": 41, "fetched": 2, "bytes": 130_000, "kept": 39,
                          "removed": 1, "seconds": 0.4}  # fmt: skip
    assert state.error is None


def test_an_error_line_keeps_a_known_kind_only() -> None:
    state = fed({"error": "s3://b/p: no such bucket", "kind": "missing"})
    assert (state.error, state.kind) == ("s3://b/p: no such bucket", "missing")
    state = fed({"error": "x", "kind": "rm -rf"})
    assert state.kind == "other"


def test_forged_counts_are_not_taken() -> None:
    state = fed(
        {"plan": {"fetch": -1, "fetch_bytes": 2**70, "keep": True, "remove": "3"}},
        {"progress": {"bytes": 1.5e30}},
        {"done": {"objects": [1], "bytes": -5, "seconds": 1e12}},
    )
    assert (state.to_fetch, state.fetch_bytes, state.kept, state.removed) == (None,) * 4
    assert state.bytes_done == 0
    assert state.done == {}


def test_progress_never_goes_back() -> None:
    state = fed({"progress": {"bytes": 500}}, {"progress": {"bytes": 100}})
    assert state.bytes_done == 500


def test_a_long_message_is_cut_and_made_one_printable_line() -> None:
    state = fed({"error": "a\x1b[31m\nb" + "x" * 5000, "kind": "other"})
    assert state.error is not None
    assert len(state.error) <= MAX_MESSAGE and "\x1b" not in state.error and "\n" not in state.error


def test_other_output_is_kept_bounded() -> None:
    state = fed(*(f"Traceback line {i}" for i in range(100)), "[1, 2]", '{"a": 1, "b": 2, "c": 3}')
    assert len(state.other) == MAX_OTHER_LINES
    assert state.other[-1] == '{"a": 1, "b": 2, "c": 3}'


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=300))
def test_any_line_is_taken_without_raising(line: str) -> None:
    fed(line)


def test_count_takes_plain_bounded_integers_only() -> None:
    assert [count(v) for v in (0, 7, -1, True, 2.0, "3", 2**62)] == [
        0,
        7,
        None,
        None,
        None,
        None,
        None,
    ]
