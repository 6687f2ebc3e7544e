"""`trainer.report` is the module `orch_trainer.report` (see trainer/train.py)."""

import sys

import orch_trainer.report

sys.modules[__name__] = orch_trainer.report
