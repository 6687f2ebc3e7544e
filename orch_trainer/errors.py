"""Errors the trainer raises on purpose.

`train.main` turns a `UsageError` into one line on stderr and exit status 2 (bad flags, an
unreadable data path, a checkpoint that cannot be resumed). Anything else is a crash: exit 1
with a traceback, so the orchestrator can tell a user mistake from a bug.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Root of the trainer's own errors."""


class UsageError(TrainerError):
    """The run cannot start as asked (flags, data path, checkpoint). Exit status 2."""


class DataError(UsageError):
    """The data source named by --data cannot be read."""


class CheckpointError(UsageError):
    """The checkpoint named for resuming is missing, incomplete or does not fit this run."""
