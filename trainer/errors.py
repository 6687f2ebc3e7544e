"""`trainer.errors` is the module `orch_trainer.errors` (see trainer/train.py)."""

import sys

import orch_trainer.errors

sys.modules[__name__] = orch_trainer.errors
