"""The command line: the only home of typer and rich. Commands call `control/` and render.

`main` is the `orch` entry point; it imports the app only when called, so that importing a
submodule (the docs generator, a renderer) does not build every command."""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """Run `orch` with the process's arguments; exits with the command's code."""
    from orchestrator.cli.app import main as run

    run()
