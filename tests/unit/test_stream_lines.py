"""How a command's output is cut into lines, whatever reads the bytes arrive in."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.remote.streams import CommandLines

OUTPUT = b"x" * 5000 + b"\nshort\n" + b"y" * 1200 + b"\nafter"
EXPECTED = ["x" * 200, "short", "y" * 200, "after"]


class _FinishedChannel:
    """A channel whose command printed `chunks` and exited 0: what CommandLines reads from."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)
        self.status_event = threading.Event()
        self.status_event.set()
        self.exit_status = 0

    def settimeout(self, _seconds: float) -> None:
        pass

    def recv(self, _size: int) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""

    def close(self) -> None:
        pass


def _read(chunks: list[bytes], max_line: int | None = 1000) -> list[str]:
    return list(CommandLines(_FinishedChannel(chunks), name="node", max_line=max_line))  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 7, 999, 1001, 4096, len(OUTPUT)])
def test_a_long_line_is_cut_the_same_in_reads_of_any_size(size: int) -> None:
    chunks = [OUTPUT[at : at + size] for at in range(0, len(OUTPUT), size)]
    assert _read(chunks) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(OUTPUT)), max_size=12))
def test_a_long_line_is_cut_the_same_wherever_the_reads_split(cuts: list[int]) -> None:
    edges = [0, *sorted(cuts), len(OUTPUT)]
    assert _read([OUTPUT[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]) == EXPECTED


def test_without_a_limit_lines_are_whole() -> None:
    assert _read([OUTPUT], max_line=None) == ["x" * 5000, "short", "y" * 1200, "after"]
