"""`trainer.run` is the module `orch_trainer.run` (see trainer/train.py)."""

import sys

import orch_trainer.run

sys.modules[__name__] = orch_trainer.run
