"""Merging a run of some benchmarks (`bench.run_all --only NAME`) into the page a full run wrote
(docs/benchmarks.md): the page is cut where each benchmark's summary rows and section begin and
end (`split_page`), and the rows and sections of the benchmarks that ran are replaced or added
(`merge_pages`); every other benchmark's stay as they were."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_ROW = re.compile(r"^\| \[(?P<name>[^\]]+)\]\(#")  # a summary row: | [name](#name) | ...
_ANCHOR = re.compile(r'^<a id="(?P<name>[^"]+)"></a>$')  # opens a benchmark's section
_REPRODUCE = "## Reproduce"


@dataclass
class PageParts:
    """A page as `render_page` writes it, cut where benchmarks begin and end. Joining
    `head`, every row, `middle`, every section and `tail` with newlines gives the page back."""

    head: list[str]  # up to the summary table's header (its `| --- |` line included)
    rows: dict[str, list[str]]  # summary rows of each benchmark, in the page's order
    middle: list[str]  # after the rows, up to the first section ("## Each benchmark")
    sections: dict[str, list[str]]  # each benchmark's section, from its anchor on
    tail: list[str]  # "## Reproduce" to the end

    def text(self, order: Sequence[str]) -> str:
        rows = [line for name in order for line in self.rows.get(name, [])]
        sections = [line for name in order for line in self.sections.get(name, [])]
        return "\n".join([*self.head, *rows, *self.middle, *sections, *self.tail])


def split_page(text: str) -> PageParts | None:
    """The parts of a page `render_page` wrote; None for text of another shape (no summary
    table, or no section where the rows say there is one)."""
    lines = text.split("\n")
    try:
        summary = lines.index("## Summary")
    except ValueError:
        return None
    header = next((i for i in range(summary, len(lines)) if lines[i].startswith("| --- ")), None)
    if header is None:
        return None
    at = header + 1
    rows: dict[str, list[str]] = {}
    while at < len(lines) and (row := _ROW.match(lines[at])):
        rows.setdefault(row.group("name"), []).append(lines[at])
        at += 1
    middle_start = at
    while at < len(lines) and not _ANCHOR.match(lines[at]) and lines[at] != _REPRODUCE:
        at += 1
    middle = lines[middle_start:at]
    sections: dict[str, list[str]] = {}
    while at < len(lines) and (anchor := _ANCHOR.match(lines[at])):
        end = at + 1
        while end < len(lines) and not _ANCHOR.match(lines[end]) and lines[end] != _REPRODUCE:
            end += 1
        sections[anchor.group("name")] = lines[at:end]
        at = end
    if not set(rows) <= set(sections):
        return None
    return PageParts(lines[: header + 1], rows, middle, sections, lines[at:])


def merge_pages(old: str, new: str, ran: Sequence[str], order: Sequence[str]) -> str | None:
    """`old` with the rows and sections of the benchmarks in `ran` taken from `new` (a page
    of a run of those only): replaced where `old` had them, else added. Benchmarks are put
    in `order`; those `old` holds that `order` lacks follow, as they were. The header (date,
    machine, load) stays `old`'s. None when either page cannot be split (write `new` then).
    """
    before, after = split_page(old), split_page(new)
    if before is None or after is None:
        return None
    for name in ran:
        before.rows[name] = after.rows.get(name, [])
        before.sections[name] = after.sections.get(name, [])
    known = [name for name in order if name in before.sections]
    rest = [name for name in before.sections if name not in order]
    return before.text([*known, *rest])
