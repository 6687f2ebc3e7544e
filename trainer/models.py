"""`trainer.models` is the module `orch_trainer.models` (see trainer/train.py)."""

import sys

import orch_trainer.models

sys.modules[__name__] = orch_trainer.models
