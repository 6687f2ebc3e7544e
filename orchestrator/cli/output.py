"""Where the commands print: one Console maker, so that piped output is never cut."""

from __future__ import annotations

import json
import sys

from rich.console import Console

# Off a terminal (a pipe, a file) output is read by programs: so wide that rich never wraps or
# crops a line, an id, a path or an error to fit a width nobody sees.
PIPE_WIDTH = 1_000_000


def make_console(*, stderr: bool = False) -> Console:
    """The Console every command prints with (to stderr when `stderr`). On a terminal rich fits
    the output to its width; elsewhere no line, id, path or error is ever wrapped or cut, so
    `orch status | grep ID` finds what it looks for."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


def print_json(document: object) -> None:
    """Print `document` as the one JSON document of a `--json` command (values JSON does not
    know, such as datetimes and Decimals, as their text)."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
