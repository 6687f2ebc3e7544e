"""Deprecated: the reference trainer is now the package `orch_trainer`; this one forwards to it.

Renamed so that it cannot collide with a project's own `trainer` package. For one release,
`python -m trainer.train` still runs `python -m orch_trainer.train` (same flags, same exit
statuses), and `import trainer.X` gives the module `orch_trainer.X` itself (the same object).
Importing `trainer` warns with a DeprecationWarning; write `orch_trainer` instead, since this
package goes in the next release.
"""

from __future__ import annotations

import importlib
import sys
import warnings

NEW_PACKAGE = "orch_trainer"

warnings.warn(
    "the package `trainer` is now `orch_trainer`: import orch_trainer and run "
    "`python -m orch_trainer.train`; `trainer` goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)


def forward(name: str) -> None:
    """Make the module being imported as `name` (`trainer.X`) be `orch_trainer.X`.

    Called at the end of `trainer/X.py`: the import system hands whatever `sys.modules[name]`
    holds to the importer, so `import trainer.X` and `from trainer.X import f` get
    orch_trainer's own module and objects (one copy of each class, no second import).
    """
    module = name.partition(".")[2]
    sys.modules[name] = importlib.import_module(f"{NEW_PACKAGE}.{module}")
