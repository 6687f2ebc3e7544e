"""The foreground submit's progress into a pipe or a file: plain lines as things happen, one per
phase and one per new progress reading, with no spinner frame, redrawn line or carriage return
(the live line is for an interactive terminal only)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from orchestrator.cli.console import RichReporter
from orchestrator.node.progress import Metrics

SPINNER = re.compile("[\u2800-\u28ff]")  # the braille frames of rich's spinners
STYLE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours, cursor moves


def reported(console: Console) -> str:
    with RichReporter(console, "demo-1") as reporter:
        reporter.phase("provisioning: 2 node(s) x 2 on local")
        reporter.phase("running: torchrun on 2 node(s) [master 10.213.0.2:29500]")
        reporter.metrics(Metrics(4, loss=0.5))
        reporter.metrics(Metrics(4, loss=0.5))  # the same reading again: no new line
        reporter.line("trainer rank=0 world_size=4")
        reporter.metrics(Metrics(8, loss=0.25))
        reporter.phase("succeeded")
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_a_pipe_gets_one_plain_line_per_phase_and_reading() -> None:
    text = reported(Console(file=io.StringIO(), width=80))
    assert text.splitlines() == [
        "orch demo-1: provisioning: 2 node(s) x 2 on local",
        "orch demo-1: running: torchrun on 2 node(s) [master 10.213.0.2:29500]",
        "running | step 4 | loss 0.5000",
        "trainer rank=0 world_size=4",
        "running | step 8 | loss 0.2500",
        "orch demo-1: succeeded",
    ]
    assert "\r" not in text and "\x1b" not in text and not SPINNER.search(text)


def test_a_terminal_that_is_not_interactive_gets_the_plain_lines_too() -> None:
    # TERM=dumb, or TTY_INTERACTIVE=0 (rich's switch)
    console = Console(file=io.StringIO(), force_terminal=True, force_interactive=False, width=80)
    text = reported(console)
    assert "\r" not in text and not SPINNER.search(text)
    lines = STYLE.sub("", text).splitlines()
    assert [line for line in lines if "succeeded" in line] == ["orch demo-1: succeeded"]


def test_an_interactive_terminal_keeps_its_live_line() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    text = reported(console)
    assert SPINNER.search(text) and "\r" in text
    assert "orch demo-1: succeeded" in STYLE.sub("", text)
