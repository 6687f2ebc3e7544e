"""`trainer.schedule` is the module `orch_trainer.schedule` (see trainer/train.py)."""

import sys

import orch_trainer.schedule

sys.modules[__name__] = orch_trainer.schedule
