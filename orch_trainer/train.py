"""Entry point: `torchrun ... -m orch_trainer.train [flags]` or `python -m orch_trainer.train`.

Exit status: 0 when the last step is done (and, with a checkpoint dir, its checkpoint
written); 143 when stopped by SIGTERM/SIGUSR1 after saving the step's checkpoint; 2 for bad
flags, unreadable data or an unusable checkpoint (one line `trainer: error: ...` on stderr, no
traceback); 1 for a crash, including a peer that stopped answering for `--timeout` seconds.

Flags are checked before torch is imported, so a typo fails in a fraction of a second. See
`orch_trainer.report` for the lines on stdout, `orch_trainer.checkpoint` for the checkpoint layout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

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


if __name__ == "__main__":
    sys.exit(main())
