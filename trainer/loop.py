"""`trainer.loop` is the module `orch_trainer.loop` (see trainer/train.py)."""

import sys

import orch_trainer.loop

sys.modules[__name__] = orch_trainer.loop
