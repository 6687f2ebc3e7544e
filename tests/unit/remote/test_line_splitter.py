"""`LineSplitter`: the lines of bytes that arrive in any pieces, cut at a cap, in bounded memory;
`printable`: what a node's bytes become as text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.remote.lines import CUT_KEEP, CUT_MARK, Line, LineSplitter, printable


def reference(data: bytes, max_line: int, *, split_cr: bool = False) -> list[Line]:
    """The lines of `data` as a whole (the model the splitter must match, however fed)."""
    if split_cr:
        pieces = data.splitlines(keepends=True)
    else:
        pieces = [piece + b"\n" for piece in data.split(b"\n")]
        pieces[-1] = pieces[-1][:-1]
    lines, start = [], 0
    for piece in pieces:
        raw = piece.rstrip(b"\r\n") if split_cr else piece.removesuffix(b"\n")
        if len(raw) > max_line:
            kept = printable(raw[: min(CUT_KEEP, max_line)])
            lines.append(Line(kept + CUT_MARK.format(max_line=max_line), start, True))
        elif piece:
            lines.append(Line(printable(raw), start, False))
        start += len(piece)
    return lines


def split(data: bytes, cuts: list[int], max_line: int, split_cr: bool) -> tuple[list[Line], int]:
    """Feed `data` in the pieces `cuts` makes; the lines and the most bytes ever held."""
    splitter = LineSplitter(max_line, split_cr=split_cr)
    edges = [0, *sorted(cuts), len(data)]
    lines, held = [], 0
    for a, b in zip(edges, edges[1:], strict=False):
        lines += splitter.feed(data[a:b])
        held = max(held, splitter.buffered)
    return lines + splitter.flush(), held


output = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.just(b"\n"),
        st.just(b"\r"),
        st.just(b"\r\n"),
        st.just(b"\xc3\xa4"),
    ),
    max_size=30,
).map(b"".join)


@given(
    output,
    st.lists(st.integers(min_value=0, max_value=1200), max_size=10),
    st.integers(min_value=1, max_value=64),
    st.booleans(),
)
def test_any_pieces_give_the_lines_of_the_whole(
    data: bytes, cuts: list[int], cap: int, split_cr: bool
) -> None:
    lines, held = split(data, [c for c in cuts if c <= len(data)], cap, split_cr)
    assert lines == reference(data, cap, split_cr=split_cr)
    assert held <= cap


def test_a_long_line_is_cut_once_and_the_next_line_starts_where_its_bytes_do() -> None:
    splitter = LineSplitter(10)
    got = splitter.feed(b"0123456789")  # exactly the cap: it may still end here
    assert got == [] and splitter.buffered == 10
    got = splitter.feed(b"ABC") + splitter.feed(b"DEF\nok\npart")
    assert got == [
        Line("0123456789" + CUT_MARK.format(max_line=10), 0, True),
        Line("ok", 17, False),
    ]
    assert splitter.buffered == 4 and splitter.cut_lines == 1
    assert splitter.flush() == [Line("part", 20, False)] and splitter.position == 24


def test_an_endless_line_holds_at_most_the_cap() -> None:
    splitter = LineSplitter(4096)
    piece = b"y" * 65536
    for _ in range(256):  # 16 MiB, no newline
        splitter.feed(piece)
        assert splitter.buffered == 0  # cut at once: the rest of the line is dropped as it comes
    assert splitter.feed(b"tail\nnext\n") == [Line("next", 16 * 1024 * 1024 + 5, False)]
    assert splitter.cut_lines == 1 and splitter.flush() == []


def test_node_bytes_become_safe_text() -> None:
    assert printable(b"step 1\r") == "step 1"  # a pseudo-terminal's CRLF
    assert printable(b"a\tb") == "a\tb"
    assert printable(b"\x1b[31mred\x1b[0m") == "\ufffd[31mred\ufffd[0m"  # no terminal control
    assert printable(b"nul\x00 bell\x07 cr\rover") == "nul\ufffd bell\ufffd cr\ufffdover"
    assert printable(b"\xff\xfe z\xc3\xa4hler \xc2\x9b") == "\ufffd\ufffd z\u00e4hler \ufffd"
