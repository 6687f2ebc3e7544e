"""Run the `orch` console entry point inside the test process: the same code path as the
installed command (argument parsing, OrchError to exit code), without a 2 s interpreter start.
For what only a separate process shows (signals, blocking reads, leftovers), use
`tests.support.helpers.run_orch`."""

from __future__ import annotations

import io
import sys


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
