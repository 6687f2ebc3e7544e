"""`trainer.sampler` is the module `orch_trainer.sampler` (see trainer/train.py)."""

import sys

import orch_trainer.sampler

sys.modules[__name__] = orch_trainer.sampler
