"""When the checkpoint agent copies a file, and when it says that no copy was taken.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer. Pure: every time is passed in.

At each look at the checkpoint directory, a file whose current version has no staged copy is:

- taken (`TAKE`) once it looked the same for `quiet_s` (its inode, size, mtime and ctime on
  looks that far apart, and an mtime that old), or at once when the run has ended. A copy
  refused then (not whole) is a problem the manifest reports: waiting will not make it whole;
- tried (`TRY`) at this very look, whatever the quiet time, when its format says it is a
  finished write (a zip, what `torch.save` writes, whose end record ends the file; a
  safetensors file as long as its header says: `checkpoint_whole.finished`). The copy is kept
  only if the file did not change while it was copied and the copy is whole, entry by entry
  (`checkpoint_copy.stage`); otherwise it is dropped without a word and tried again at the
  next look. So a file saved every second is still captured, however busy the node, and a copy
  is never torn;
- else left to wait (`WAIT`): a file of another format must be quiet, since nothing else tells
  that its write is over.

A file is copied as a hard link, not a byte copy, once its new versions are seen to arrive as
new files renamed over it (never written in place): the link then holds that version for good.

A file rewritten at least `UNCAPTURED_TIMES` times since its last copy (or since it was first
seen), for at least `UNCAPTURED_TIMES` of its rewrite intervals and `min_s`, is reported as
uncaptured (`History.uncaptured`), so the controller can say so. A file that only grows (a log)
is not rewritten: only a new version that is no longer than the last, or a new inode, counts.
"""

from __future__ import annotations

import os
from collections.abc import Callable

if __package__:
    from orchestrator.node.checkpoint_files import identity
else:  # the program on a node: its modules are beside it
    from checkpoint_files import identity

QUIET_S = 1.0  # a file unchanged this long has been written (torch.save writes in one go)
UNCAPTURED_TIMES = 5  # rewrites (and rewrite intervals) without a copy before it is reported
UNCAPTURED_MIN_S = 30.0  # and never sooner than this
REWRITES_KEPT = 16  # the last rewrites the interval is measured on

TAKE = "take"
TRY = "try"
WAIT = "wait"


class History:
    """One file's versions as this agent's looks saw them; times are `time.monotonic()`."""

    def __init__(self, info: os.stat_result, now: float) -> None:
        self.looks = identity(info)
        self.since = now  # when the current looks were first seen
        self.inode = info.st_ino
        self.size = info.st_size
        self.rewrites: list[float] = []  # the looks that saw a rewrite, the last REWRITES_KEPT
        self.renamed = False  # a new version came as a new inode
        self.in_place = False  # a new version came in the same inode
        self.captured_at: float | None = None
        self.uncaptured_since = now  # the last copy, or the first look
        self.uncaptured_rewrites = 0

    def look(self, info: os.stat_result, now: float) -> bool:
        """Record one look at the file; True when it changed since the last."""
        looks = identity(info)
        if looks == self.looks:
            return False
        if info.st_ino == self.inode:
            self.in_place = True
        else:
            self.renamed = True
        if info.st_ino != self.inode or info.st_size <= self.size:
            self.rewrites = [*self.rewrites[1 - REWRITES_KEPT :], now]
            self.uncaptured_rewrites += 1
        self.looks, self.since, self.inode, self.size = looks, now, info.st_ino, info.st_size
        return True

    def quiet(self, info: os.stat_result, now: float, now_ns: int, quiet_s: float) -> bool:
        """Whether the file looked the same for `quiet_s`, by these looks and by its mtime."""
        return now - self.since >= quiet_s and now_ns - info.st_mtime_ns >= quiet_s * 1e9

    @property
    def linkable(self) -> bool:
        """Whether a hard link holds the current version for good: versions so far came as new
        files renamed over this one, never written in place."""
        return self.renamed and not self.in_place

    def captured(self, now: float) -> None:
        """A version of the file was staged at `now`."""
        self.captured_at = now
        self.uncaptured_since = now
        self.uncaptured_rewrites = 0

    @property
    def every_s(self) -> float | None:
        """The file's rewrite interval (the median between the looks that saw a rewrite; looks
        that far apart see one rewrite at most), or None before two were seen."""
        times = self.rewrites
        gaps = sorted(times[i + 1] - times[i] for i in range(len(times) - 1))
        return gaps[len(gaps) // 2] if gaps else None

    def uncaptured(self, now: float, min_s: float = UNCAPTURED_MIN_S) -> float | None:
        """The rewrite interval of a file that went too long without a copy (see the module
        docstring), or None."""
        every = self.every_s
        if every is None or self.uncaptured_rewrites < UNCAPTURED_TIMES:
            return None
        if now - self.uncaptured_since < max(UNCAPTURED_TIMES * every, min_s):
            return None
        return every


def decide(
    history: History,
    info: os.stat_result,
    *,
    now: float,
    now_ns: int,
    quiet_s: float,
    ended: bool,
    finished: Callable[[], bool | None],
) -> str:
    """`TAKE`, `TRY` or `WAIT` for a file whose current version has no staged copy (see the
    module docstring). `finished()` (asked only when the file is not quiet): what
    `checkpoint_whole.finished` says of it now (None: its format cannot tell; False also where
    taking at a look is switched off)."""
    if ended or history.quiet(info, now, now_ns, quiet_s):
        return TAKE
    return TRY if finished() else WAIT
