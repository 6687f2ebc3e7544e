"""Where the spot traces the acceptance tests run on are: `traces/` in the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACES_DIR = Path(__file__).resolve().parents[2] / "traces"
"""The repository's `traces/` (three AWS p3.2xlarge traces, see its README)."""


def shared_trace_paths() -> list[Path]:
    """The three traces the acceptance tests run on; the test fails if they are missing."""
    paths = sorted(TRACES_DIR.glob("*.json"))
    if len(paths) < 3:
        pytest.fail(f"expected the 3 spot traces in {TRACES_DIR}, found {len(paths)}")
    return paths
