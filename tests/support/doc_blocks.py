"""Reading the examples out of the user docs (README.md and docs/*.md) for the tests that run them.

A code block is an example when the comment line above it says how it is used (docs/README.md
explains the kinds): `<!-- example: run -->`, `<!-- example: job NAME -->`, `<!-- example: file
NAME -->`, `<!-- example: config -->`, `<!-- example: iam-policy -->`, `<!-- example: covered-by
TEST[, TEST...] -->`. Blocks of language `text` are illustrations, not examples.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

OWN_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
"""The pages whose every example carries a marker (spot-deadlines.md and the generated
benchmarks page are checked by their own tests)."""
UNMARKED_DOCS = {"spot-deadlines.md", "benchmarks.md"}

MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<kind>[a-z-]+)\s*(?P<arg>.*?)\s*-->\s*$")
KINDS = {"run", "job", "file", "config", "iam-policy", "covered-by"}


@dataclass
class Block:
    """One code block of a page."""

    path: Path
    line: int  # 1-based line of its first line of code
    lang: str  # the fence's language ("" for an indented block)
    text: str
    kind: str | None = None  # the marker's kind, None when unmarked
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_pages() -> list[Path]:
    return [p for p in OWN_DOCS if p.name not in UNMARKED_DOCS]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of `path`, plus indented blocks that follow a marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    marker: re.Match[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang = line[3:].strip()
            end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            found.append(
                Block(
                    path,
                    i + 2,
                    lang,
                    "\n".join(lines[i + 1 : end]),
                    marker.group("kind") if marker else None,
                    marker.group("arg") if marker else "",
                )  # fmt: skip
            )
            marker = None
            i = end + 1
            continue
        if marker is not None and line.startswith("    "):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            body = [text[4:] for text in lines[i:end]]
            found.append(
                Block(
                    path,
                    i + 1,
                    "",
                    "\n".join(body).strip("\n"),
                    marker.group("kind"),
                    marker.group("arg"),
                )  # fmt: skip
            )
            marker = None
            i = end
            continue
        match = MARKER.match(line)
        if match:
            marker = match
        elif line.strip():
            marker = None
        i += 1
    return found


def unmarked_indented_commands(path: Path) -> list[int]:
    """Lines of `path` that look like an indented `orch` command outside any example."""
    covered: set[int] = set()
    for block in blocks(path):
        covered.update(range(block.line - 1, block.line + block.text.count("\n") + 2))
    found = []
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence or number in covered:
            continue
        if re.match(r"^ {4,}(\$ )?(\.venv/bin/)?orch\s", line):
            found.append(number)
    return found


@dataclass
class Command:
    """One `orch` command of a run block, with what it must do."""

    line: int
    env: dict[str, str]  # VAR=value prefixes
    args: list[str]  # after `orch`
    exit_code: int = 0
    expected: list[str] = field(default_factory=list)  # console blocks: lines of output

    def shown(self) -> str:
        prefix = " ".join(f"{k}={v}" for k, v in self.env.items())
        return " ".join(filter(None, [prefix, "orch", *map(shlex.quote, self.args)]))


_EXIT = re.compile(r"#\s*exit\s+(\d+)\b")


def parse_command(text: str, line: int) -> Command:
    """`[VAR=value ...] orch ARGS [# exit N] [# comment]`; ValueError for anything else."""
    words = shlex.split(text, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words or words[0] not in ("orch", ".venv/bin/orch"):
        raise ValueError(f"line {line}: not an orch command: {text!r}")
    exit_code = _EXIT.search(text)
    return Command(line, env, words[1:], int(exit_code.group(1)) if exit_code else 0)


def run_commands(block: Block) -> list[Command]:
    """The commands of a `run` block: every line of an `sh` block, the `$ ` lines of a
    `console` block (the lines under each are its expected output)."""
    commands: list[Command] = []
    for offset, raw in enumerate(block.text.splitlines()):
        line = block.line + offset
        text = raw.strip()
        if block.lang == "console":
            if text.startswith("$ "):
                commands.append(parse_command(text[2:], line))
            elif text:
                if not commands:
                    raise ValueError(f"line {line}: output before any `$ ` command")
                commands[-1].expected.append(text)
        elif text and not text.startswith("#"):
            commands.append(parse_command(text, line))
    return commands


def output_matches(expected: str, output: str) -> bool:
    """Whether one expected line appears in the output, whitespace (and wrapping) aside;
    `...` in the expected line stands for any text."""
    flat = " ".join(output.split())
    parts = [re.escape(" ".join(part.split())) for part in expected.split("...")]
    return re.search(r".*?".join(parts), flat) is not None


def covered_by(arg: str) -> list[str]:
    return [item.strip() for item in arg.split(",") if item.strip()]
