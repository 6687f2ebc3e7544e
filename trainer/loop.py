"""Deprecated alias of `orch_trainer.loop` (the same module): import that instead; this alias
goes in the next release.
"""

from trainer import forward

forward(__name__)
