"""The house's size fence: no module of orch over `MAX_FILE_LINES` lines and no class over
`MAX_CLASS_LINES`, the programs orch sends to nodes included. A room that outgrows them is split
by job (docs/architecture.md), not given an exception here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "orch_trainer", "trainer")
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 400


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def long_classes(source: str, name: str) -> list[str]:
    """`NAME:LINE class C: N lines` for each class of `source` over the limit, nested ones too."""
    return [
        f"{name}:{node.lineno} class {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source, filename=name))
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]


def test_the_fence_reads_the_package_and_the_node_programs() -> None:
    found = sources()
    assert len(found) > 100 and any(p.parent.name == "node" for p in found)


def test_no_module_is_over_the_line_limit() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not long, f"split these by job (at most {MAX_FILE_LINES} lines): {long}"


def test_no_class_is_over_the_line_limit() -> None:
    long = [e for p in sources() for e in long_classes(p.read_text(), str(p.relative_to(ROOT)))]
    assert not long, f"split these (at most {MAX_CLASS_LINES} lines a class): {long}"


@pytest.mark.parametrize(
    ("lines", "caught"), [(MAX_CLASS_LINES, False), (MAX_CLASS_LINES + 1, True)]
)
def test_a_class_is_counted_from_its_line_to_its_last(lines: int, caught: bool) -> None:
    nested = "def outer():\n    class Big:\n" + "".join(
        f"        x{i} = {i}\n" for i in range(lines - 1)
    )
    assert bool(long_classes(nested, "synthetic.py")) is caught
