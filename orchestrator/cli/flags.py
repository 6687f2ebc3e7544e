"""Flag value types shared by the commands.

Every duration flag takes what the spec takes (`orchestrator.spec.values.parse_duration`):
600, 90s, 10m, 1h30m, 2d. A bad value is click's usage error: exit 2, naming the flag.
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

DURATION_METAVAR = "DURATION"

JsonFlag = Annotated[bool, typer.Option("--json", help="print one JSON document")]


def duration(text: str) -> float:
    """A duration flag's value in seconds (not negative)."""
    from orchestrator.spec.values import parse_duration  # pydantic: only once a flag is given

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise typer.BadParameter(f"{text!r}: a duration must be 0 or more")
    return seconds
