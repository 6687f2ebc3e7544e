"""How `orch --help` and every `orch VERB --help` read: paragraphs, not the docstrings' lines.

A docstring is wrapped at the source's width; typer's rich help keeps those line breaks (in
the list of commands and in every paragraph after the first), so at any other terminal width a
sentence breaks in the middle ("The table has a row for / each of ..."). `tidy` joins each
paragraph's lines, as docs/cli.md does (`reference._indent_free`), and lets the terminal wrap
them. A boolean flag takes no value, so it shows none (typer would print `<bool>`).
"""

from __future__ import annotations

import re
from typing import Any

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def paragraphs(text: str) -> str:
    """`text` with the line breaks inside each paragraph joined; paragraphs (blank lines)
    kept."""
    parts = _PARAGRAPH_BREAK.split(text.strip())
    return "\n\n".join(" ".join(part.split()) for part in parts if part.strip())


def tidy(command: Any) -> Any:
    """`command` (the click command typer builds) and every command under it with paragraph
    help texts and no value shown for boolean flags; returns `command` (changed in place)."""
    if command.help:
        command.help = paragraphs(command.help)
    for param in command.params:
        _no_value(param)
    made = command.get_help_option  # --help is made when first asked for, with a context

    def help_option(ctx: Any) -> Any:
        return _no_value(made(ctx))

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        tidy(sub)
    return command


def _no_value(param: Any) -> Any:
    if getattr(param, "param_type_name", "") == "option" and getattr(param, "is_flag", False):
        param.metavar = ""
    return param
