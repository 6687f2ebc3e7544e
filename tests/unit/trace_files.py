"""Where the spot traces the acceptance tests run on are (`traces/` in the repository), and
generated traces for the property tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import strategies as st

from orchestrator.providers.traces import SpotTrace

TRACES_DIR = Path(__file__).resolve().parents[2] / "traces"
"""The repository's `traces/` (three AWS p3.2xlarge traces, see its README)."""


def shared_trace_paths() -> list[Path]:
    """The three traces the acceptance tests run on; the test fails if they are missing."""
    paths = sorted(TRACES_DIR.glob("*.json"))
    if len(paths) < 3:
        pytest.fail(f"expected the 3 spot traces in {TRACES_DIR}, found {len(paths)}")
    return paths


def availability_traces(
    gaps_s: Sequence[float], *, longest_run: int, most_runs: int, repeat: int = 1
) -> st.SearchStrategy[SpotTrace]:
    """Traces of one spot node: runs of up to `longest_run` ticks with and without spot, at
    most `most_runs` of them, the whole pattern `repeat` times, one tick every gap of `gaps_s`."""

    @st.composite
    def traces(draw: st.DrawFn) -> SpotTrace:
        gap = draw(st.sampled_from(list(gaps_s)))
        runs = draw(
            st.lists(
                st.tuples(st.booleans(), st.integers(1, longest_run)), min_size=1,
                max_size=most_runs,
            )
        )  # fmt: skip
        counts = [int(up) for up, length in runs for _ in range(length)] * repeat
        return SpotTrace(name="random", gap_s=gap, counts=tuple(counts))

    return traces()
