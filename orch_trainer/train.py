"""Entry point: `torchrun ... -m orch_trainer.train [flags]` or `python -m orch_trainer.train`.

Exit status: 0 when the last step is done (and, with a checkpoint dir, its checkpoint
written); 143 when stopped by SIGTERM/SIGUSR1 after saving the step's checkpoint; 2 for bad
flags, unreadable data or an unusable checkpoint (one line `trainer: error: ...` on stderr, no
traceback); 1 for a crash, including a peer that stopped answering for `--timeout` seconds.

The process leaves through `os._exit` once the run is over and its output flushed: with torch
2.14 and gloo, a rank that returns through normal interpreter shutdown sometimes aborts in C++
teardown ("terminate called without an active exception", SIGABRT), which would turn a finished
run's 0, or a timed-out collective's 1, into -6.

Flags are checked before torch is imported, so a typo fails in a fraction of a second. See
`orch_trainer.report` for the lines on stdout, `orch_trainer.checkpoint` for the checkpoint layout.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import NoReturn

from orch_trainer.args import parse_args
from orch_trainer.errors import UsageError
from orch_trainer.signals import StopRequest

EXIT_USAGE = 2


def _usage_error(exc: UsageError) -> int:
    message = " ".join(str(exc).split())
    sys.stderr.write(f"trainer: error: {message}\n")
    sys.stderr.flush()
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the trainer; return the process exit status (see the module docstring)."""
    environ = os.environ if environ is None else environ
    try:
        cfg = parse_args(argv, environ)
    except UsageError as exc:
        return _usage_error(exc)
    stop = StopRequest()
    stop.install()  # before the slow imports: a stop request then ends the run after step 1
    from orch_trainer.run import run  # torch is imported only once the flags are known good

    try:
        return run(cfg, stop, environ)
    except UsageError as exc:
        return _usage_error(exc)


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, then end the process with `code`, skipping interpreter
    finalization (see the module docstring). Everything the run writes is closed by then."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    sys.stderr.write(f"{exc.code}\n")
    return 1


if __name__ == "__main__":
    try:
        status = main()
    except SystemExit as exc:
        status = _exit_code(exc)
    except KeyboardInterrupt:
        status = 130
    except BaseException:  # printed as Python would print it, then exit 1
        traceback.print_exc()
        status = 1
    exit_now(status)
