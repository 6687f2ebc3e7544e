"""`trainer.precision` is the module `orch_trainer.precision` (see trainer/train.py)."""

import sys

import orch_trainer.precision

sys.modules[__name__] = orch_trainer.precision
