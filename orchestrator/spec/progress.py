"""The `progress` section of a job spec: how orch reads the steps of a script that prints
plain text.

    progress: {pattern: 'Epoch (?P<step>\\d+)'}

`pattern` is a Python regular expression searched in each line rank 0 prints (its first 500
characters). Its named group `step` (plain digits) is the step; `total` (the step the run
ends at) and `loss` (a number) are read when the pattern has them. With a pattern, the lines
it matches are the job's step lines for everything that reads progress: the step shown and
recorded, the report, and the start and stall timeouts of the controller and the node guard
(`orchestrator.node.run_progress`, which applies it on the nodes). JSON step lines no longer
count then.

A pattern is checked when the spec is read: it compiles, has a `step` group and no named
group other than `step`, `total` and `loss`, is at most `MAX_PATTERN_CHARS` long, and has no
repeat inside a repeat and no alternation inside a repeat (`(\\d+)+`, `(a|ab)*`): a job's
output is not trusted, and such a pattern can take exponential time on a line made for it.
"""

from __future__ import annotations

import re
import re._constants as sre_constants  # the parse tree's opcodes (no public module has them)
import re._parser as sre_parse  # the stdlib's own parser: the only way to see a pattern's tree
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_PATTERN_CHARS = 500
PATTERN_GROUPS = ("step", "total", "loss")  # as `orchestrator.node.run_progress` reads them

_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}
_REPEATS |= {getattr(sre_constants, "POSSESSIVE_REPEAT", sre_constants.MAX_REPEAT)}


class ProgressSpec(BaseModel):
    """How rank 0's progress is read from a script that prints plain text."""

    model_config = ConfigDict(extra="forbid")

    pattern: str | None = Field(
        default=None,
        description="a regular expression searched in each line rank 0 prints: its named "
        "group `step` (digits) is the step, `total` and `loss` are read too; the lines it "
        "matches are the job's steps for the step shown, the report and the start and stall "
        "timeouts; null: JSON step lines, and common progress bars and Epoch lines for display",
    )

    @field_validator("pattern")
    @classmethod
    def _pattern_ok(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_pattern(value)


def check_pattern(text: str) -> str:
    """`text` when it is a usable progress pattern; ValueError saying what to change."""
    if not text.strip():
        raise ValueError("is empty: give a regular expression with a (?P<step>\\d+) group")
    if len(text) > MAX_PATTERN_CHARS:
        raise ValueError(f"is longer than {MAX_PATTERN_CHARS} characters")
    try:
        compiled = re.compile(text)
        tree = sre_parse.parse(text)
    except (re.error, OverflowError, RecursionError) as exc:
        raise ValueError(f"is not a regular expression: {exc}") from None
    if "step" not in compiled.groupindex:
        raise ValueError(
            "has no group named step: mark the step's digits as (?P<step>\\d+), "
            "e.g. 'Epoch (?P<step>\\d+)'"
        )
    unknown = sorted(set(compiled.groupindex) - set(PATTERN_GROUPS))
    if unknown:
        raise ValueError(
            f"has a group named {', '.join(unknown)}: name only step, total and loss "
            "(use (?:...) for other groups)"
        )
    if _risky(tree.data, inside_repeat=False):
        raise ValueError(
            "repeats a part that itself repeats or has alternatives, e.g. (\\d+)+ or (a|ab)*: "
            "that can take exponential time on some lines; write it without the outer repeat"
        )
    return text


def _risky(items: Any, *, inside_repeat: bool) -> bool:
    """Whether the parsed pattern `items` holds, inside a repeat of more than once, another
    such repeat or an alternation."""
    for op, arg in items:
        if op in _REPEATS:
            low, high, sub = arg
            many = high is sre_constants.MAXREPEAT or high > 1
            if inside_repeat and many:
                return True
            if _risky(sub, inside_repeat=inside_repeat or many):
                return True
        elif op is sre_constants.BRANCH:
            if inside_repeat:
                return True
            if any(_risky(branch, inside_repeat=False) for branch in arg[1]):
                return True
        elif op is sre_constants.SUBPATTERN:
            if _risky(arg[-1], inside_repeat=inside_repeat):
                return True
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            if _risky(arg[1], inside_repeat=inside_repeat):
                return True
        elif op is getattr(sre_constants, "ATOMIC_GROUP", None):
            if _risky(arg, inside_repeat=inside_repeat):
                return True
        elif op is sre_constants.GROUPREF_EXISTS:
            branches = [arg[1], arg[2]] if arg[2] is not None else [arg[1]]
            if any(_risky(b, inside_repeat=inside_repeat) for b in branches):
                return True
    return False
