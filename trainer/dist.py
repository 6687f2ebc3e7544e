"""`trainer.dist` is the module `orch_trainer.dist` (see trainer/train.py)."""

import sys

import orch_trainer.dist

sys.modules[__name__] = orch_trainer.dist
