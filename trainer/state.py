"""`trainer.state` is the module `orch_trainer.state` (see trainer/train.py)."""

import sys

import orch_trainer.state

sys.modules[__name__] = orch_trainer.state
