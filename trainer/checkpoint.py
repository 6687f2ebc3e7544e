"""`trainer.checkpoint` is the module `orch_trainer.checkpoint` (see trainer/train.py)."""

import sys

import orch_trainer.checkpoint

sys.modules[__name__] = orch_trainer.checkpoint
