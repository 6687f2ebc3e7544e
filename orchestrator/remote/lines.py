"""Cutting what a node prints into lines, in bounded memory and time linear in the bytes (pure).

A node's output is untrusted: a line may never end (`cat /dev/zero`), carry bytes that are not
UTF-8, or hold control characters that would drive the terminal it reaches (escape sequences,
carriage returns) or that a database refuses (NUL). `LineSplitter` takes the bytes as they
come and hands over whole lines: it scans each byte once, holds at most `max_line` bytes of an
unfinished line, and cuts a longer one to a kept prefix and a marker. `printable` is how a
line's bytes become text.
"""

from __future__ import annotations

import re
from typing import NamedTuple

DEFAULT_MAX_LINE = 64 * 1024  # bytes of one line a reader holds; a longer one is cut
CUT_KEEP = 200  # bytes kept of a line that was cut
CUT_MARK = " [line cut: longer than {max_line} bytes]"

# C0 controls but tab and newline, DEL and C1 controls.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CR_OR_LF = re.compile(b"[\r\n]")


def printable(raw: bytes) -> str:
    """A line's bytes as text: UTF-8, undecodable bytes and control characters (but tab)
    replaced by U+FFFD, a trailing carriage return (a pseudo-terminal's CRLF) dropped."""
    text = raw.decode("utf-8", errors="replace")
    return scrub(text[:-1] if text.endswith("\r") else text)


def scrub(text: str) -> str:
    """`text` with its control characters but tab and newline replaced by U+FFFD, for a
    terminal or a record (PostgreSQL refuses NUL)."""
    return _CONTROL.sub("\ufffd", text)


class Line(NamedTuple):
    """One line a `LineSplitter` handed over."""

    text: str  # `printable` of its bytes (its kept prefix and the marker, if cut)
    start: int  # stream position of its first byte (bytes fed before it)
    cut: bool  # longer than the splitter's `max_line`: the rest of it was dropped


class LineSplitter:
    """Bytes in (`feed`, as they arrive, in pieces of any size), whole lines out.

    Contract:
    - a line is its bytes up to a newline, without it, as `printable` text; the bytes after
      the last newline wait for the next `feed` (`flush` hands them over at the end). With
      `split_cr`, a carriage return ends a line too, and CRLF ends one (as `bytes.splitlines`
      reads a log of progress bars, each redrawn after a CR);
    - a line longer than `max_line` bytes is handed over as soon as that is known, as its first
      `CUT_KEEP` bytes (at most `max_line`) and `CUT_MARK`; the rest of it, up to its newline,
      is dropped, however the bytes arrive. So the splitter never holds more than `max_line`
      bytes (`buffered`);
    - each byte fed is looked at once: time is linear in the bytes, whatever the line lengths.
    """

    def __init__(
        self, max_line: int = DEFAULT_MAX_LINE, *, position: int = 0, split_cr: bool = False
    ) -> None:
        if max_line < 1:
            raise ValueError("max_line must be at least 1")
        self.max_line = max_line
        self.split_cr = split_cr
        self.position = position  # stream position just after the last byte fed
        self.cut_lines = 0  # lines cut so far
        self._partial = bytearray()  # the unfinished line's bytes (at most max_line)
        self._start = position  # stream position of the unfinished line's first byte
        self._dropping = False  # inside a line that was cut: its bytes are dropped
        self._lf_follows = False  # a line ended at the last byte fed, a CR: an LF is its end too

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished line held now (never more than `max_line`)."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[Line]:
        """The lines that `data` completes (or shows to be too long), in order."""
        lines: list[Line] = []
        view = memoryview(data)
        at = 1 if self._lf_follows and data[:1] == b"\n" else 0
        self._lf_follows = self._lf_follows and not data
        self._start += at
        while at <= len(data):
            newline = self._line_end(data, at)
            end = len(data) if newline < 0 else newline
            if not self._dropping:
                room = self.max_line - len(self._partial)
                if end - at > room:
                    self._partial += view[at : at + min(room, CUT_KEEP)]
                    lines.append(self._cut())
                else:
                    self._partial += view[at:end]
            if newline < 0:
                break
            if self._dropping:
                self._dropping = False
            else:
                lines.append(Line(printable(self._partial), self._start, False))
                self._partial.clear()
            at = newline + 1
            if data[newline] == 0x0D:  # a CR (with `split_cr`): an LF right after it is its end
                self._lf_follows = at == len(data)
                at += data[at : at + 1] == b"\n"
            self._start = self.position + at
        self.position += len(data)
        return lines

    def flush(self) -> list[Line]:
        """The last line, when the bytes ended without a newline (nothing if it was cut)."""
        lines = []
        if self._partial and not self._dropping:
            lines.append(Line(printable(self._partial), self._start, False))
        self._partial.clear()
        self._dropping = self._lf_follows = False
        self._start = self.position
        return lines

    def _line_end(self, data: bytes, at: int) -> int:
        """Where the next line of `data` from `at` on ends (-1: not in `data`)."""
        if not self.split_cr:
            return data.find(b"\n", at)
        found = _CR_OR_LF.search(data, at)
        return -1 if found is None else found.start()

    def _cut(self) -> Line:
        kept = printable(self._partial[:CUT_KEEP])
        line = Line(kept + CUT_MARK.format(max_line=self.max_line), self._start, True)
        self._partial.clear()
        self._dropping = True
        self.cut_lines += 1
        return line
