"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory holding a `data/` directory next to where job.yaml is written."""
    (tmp_path / "data").mkdir()
    return tmp_path
