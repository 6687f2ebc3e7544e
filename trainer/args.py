"""`trainer.args` is the module `orch_trainer.args` (see trainer/train.py)."""

import sys

import orch_trainer.args

sys.modules[__name__] = orch_trainer.args
