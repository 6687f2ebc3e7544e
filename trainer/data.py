"""`trainer.data` is the module `orch_trainer.data` (see trainer/train.py)."""

import sys

import orch_trainer.data

sys.modules[__name__] = orch_trainer.data
