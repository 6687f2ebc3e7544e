"""Where the shared spot availability traces are: `shared/spot-traces/` next to the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACES_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "spot-traces"
"""../shared/spot-traces relative to the repository root (the CI clone sits next to it too)."""


def shared_trace_paths() -> list[Path]:
    """The three traces the acceptance tests run on; the test fails if they are missing."""
    paths = sorted(TRACES_DIR.glob("*.json"))
    if len(paths) < 3:
        pytest.fail(
            f"expected the 3 spot traces in {TRACES_DIR} (shared/spot-traces next to the "
            f"repository), found {len(paths)}"
        )
    return paths
