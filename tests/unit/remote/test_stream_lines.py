"""How a command's output is cut into lines, whatever reads the bytes arrive in, and in a
bounded buffer whatever the command prints."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.remote.lines import CUT_MARK, DEFAULT_MAX_LINE
from orchestrator.remote.streams import CommandLines

OUTPUT = b"x" * 5000 + b"\nshort\n" + b"y" * 1200 + b"\nafter"
MARK = CUT_MARK.format(max_line=1000)
EXPECTED = ["x" * 200 + MARK, "short", "y" * 200 + MARK, "after"]


class _FinishedChannel:
    """A channel whose command printed `chunks` and exited 0: what CommandLines reads from."""

    def __init__(self, chunks: list[bytes] | Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self.status_event = threading.Event()
        self.status_event.set()
        self.exit_status = 0

    def settimeout(self, _seconds: float) -> None:
        pass

    def recv(self, _size: int) -> bytes:
        return next(self._chunks, b"")

    def close(self) -> None:
        pass


def _read(chunks: list[bytes], max_line: int = 1000) -> list[str]:
    return list(CommandLines(_FinishedChannel(chunks), name="node", max_line=max_line))  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 7, 999, 1001, 4096, len(OUTPUT)])
def test_a_long_line_is_cut_the_same_in_reads_of_any_size(size: int) -> None:
    chunks = [OUTPUT[at : at + size] for at in range(0, len(OUTPUT), size)]
    assert _read(chunks) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(OUTPUT)), max_size=12))
def test_a_long_line_is_cut_the_same_wherever_the_reads_split(cuts: list[int]) -> None:
    edges = [0, *sorted(cuts), len(OUTPUT)]
    assert _read([OUTPUT[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]) == EXPECTED


def test_lines_within_the_limit_are_whole() -> None:
    assert _read([OUTPUT], max_line=5000) == ["x" * 5000, "short", "y" * 1200, "after"]


def test_an_endless_line_costs_a_bounded_buffer_by_default() -> None:
    """64 MiB without a newline, in reads of 64 KiB as paramiko hands them over, then a line:
    the stream holds at most its default line cap (64 KiB), never the line."""
    chunk = b"\0" * 65536
    chunks = iter([*(chunk for _ in range(1024)), b"\nnext\n"])
    tracemalloc.start()
    try:
        got = list(CommandLines(_FinishedChannel(chunks), name="node"))  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == ["\ufffd" * 200 + CUT_MARK.format(max_line=DEFAULT_MAX_LINE), "next"]
    assert peak < 4 * DEFAULT_MAX_LINE + 2 * len(chunk), f"peak {peak} bytes"
