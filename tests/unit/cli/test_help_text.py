"""Every `orch ... --help` reads as paragraphs: a docstring's own line breaks (it is wrapped at
the source's width) never break a sentence on the screen, in a command's help or in the list
of commands; and a boolean flag shows no value (`--version`, not `--version <bool>`). Each help
is rendered through the console entry point, on a terminal wide enough for any paragraph."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main

from orchestrator.cli.app import app
from tests.support.in_process import run_main

WIDE = "2000"  # columns: every paragraph fits on one line


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            yield from commands(sub, (*path, name))


ALL = list(commands(typer.main.get_command(app)))


def paragraphs(text: str) -> list[str]:
    """A docstring's paragraphs, each with its lines joined: what one screen line shows."""
    return [" ".join(part.split()) for part in re.split(r"\n\s*\n", text) if part.strip()]


def screen_lines(text: str) -> list[str]:
    """The rendered help's lines without panel borders and padding."""
    return [" ".join(line.strip(" │╭╮╰╯─").split()) for line in text.splitlines()]


def help_of(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", WIDE)
    monkeypatch.setenv("ORCH_HOME", "/nonexistent/orch-help-test")
    code, out, err = run_main([*path, "--help"])
    assert code == 0, out + err
    return out


def test_every_command_is_listed() -> None:
    names = {" ".join(path) for path, _ in ALL}
    assert {"submit", "status", "cost", "ssh", "local preempt", "controller up"} <= names


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "orch" for p, _ in ALL])
def test_each_paragraph_is_one_line_and_flags_show_no_value(
    path: tuple[str, ...], command: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = screen_lines(help_of(path, monkeypatch))
    for paragraph in paragraphs(command.help or ""):
        assert any(paragraph in line for line in shown), (paragraph, shown)
    # In a group's list of commands, each one's first paragraph is one line too.
    for name, sub in getattr(command, "commands", {}).items():
        if getattr(sub, "hidden", False):
            continue
        first = paragraphs(sub.help or "")[0]
        assert any(line.startswith(name) and first in line for line in shown), (name, shown)
    assert not [line for line in shown if re.search(r"<bool>", line)], shown
