"""`python -m trainer.train` is `python -m orch_trainer.train`: the same reference trainer, flags
and exit statuses; `import trainer.X` gives the module `orch_trainer.X` itself.

`trainer` is a namespace package (no `__init__.py`) so that it never hides a project's own
`trainer`: a project's regular `trainer` package wins wherever it lies on the path, and a
project's namespace `trainer` folder is merged with this one, its own modules found first when
it comes first (a job's workdir does: the job runs there). orch itself runs its trainer as
`orch_trainer`, the name no project's package takes (docs/spot.md, "The reference trainer").
"""

import importlib
import runpy
import sys

if __name__ == "__main__":
    runpy.run_module("orch_trainer.train", run_name="__main__", alter_sys=True)
else:
    sys.modules[__name__] = importlib.import_module("orch_trainer.train")
