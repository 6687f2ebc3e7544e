"""`trainer.signals` is the module `orch_trainer.signals` (see trainer/train.py)."""

import sys

import orch_trainer.signals

sys.modules[__name__] = orch_trainer.signals
