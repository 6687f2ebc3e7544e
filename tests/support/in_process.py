"""Run the `orch` console entry point inside the test process: the same code path as the
installed command (argument parsing, OrchError to exit code), without a 2 s interpreter start.
For what only a separate process shows (signals, blocking reads, leftovers), use
`tests.support.helpers.run_orch`."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """Run `orch ARGV` in this process; (exit code, stdout, stderr). The environment is this
    process's: set ORCH_HOME and friends with monkeypatch first."""
    from orchestrator.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, sys.stdout, sys.stderr
    sys.argv, sys.stdout, sys.stderr = ["orch", *argv], out, err
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point `ORCH_HOME` at `tmp_path/orch` and drop every other ORCH_* variable for one test,
    so `run_main` sees only the test's ledger and settings; returns the home (not created)."""
    for name in [n for n in os.environ if n.startswith("ORCH_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "orch"
    monkeypatch.setenv("ORCH_HOME", str(home))
    return home
