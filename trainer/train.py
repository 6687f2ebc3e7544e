"""Deprecated: `python -m trainer.train` runs `python -m orch_trainer.train` (same flags, same
exit statuses), and `import trainer.train` is `orch_trainer.train`. Write `orch_trainer`
instead; this forwarder goes in the next release.
"""

from __future__ import annotations

import runpy
import warnings

from trainer import forward

if __name__ == "__main__":
    # Warned from __main__, so Python's default filters show it (on the rank's stderr).
    warnings.warn(
        "`python -m trainer.train` is deprecated: run `python -m orch_trainer.train` (same flags)",
        DeprecationWarning,
        stacklevel=1,
    )
    runpy.run_module("orch_trainer.train", run_name="__main__", alter_sys=True)
else:
    forward(__name__)
