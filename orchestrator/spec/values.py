"""The value types of the job spec and how each is read: counts, durations, money, deadlines,
environment variables and paths (pure; the models in `orchestrator.spec.model` use them).

Each validator raises ValueError with a message that says what is accepted; `load_job` turns
it into the one line that names the field.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DURATION_RE = re.compile(r"(?:\s*\d+(?:\.\d+)?\s*[smhd])+\s*")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION_HELP = "seconds (600) or a number with units s, m, h, d (90s, 30m, 4h, 1h30m, 2d)"

# --------------------------------------------------------------------------------------------
# Field types


class FieldError(ValueError):
    """A check across fields that belongs to one of them: raised by a model validator, it is
    reported at `loc` below the model (`("container", "credentials", "password_secret")`)
    instead of at the model itself."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def parse_duration(value: object) -> float:
    """Return `value` as seconds: a number is seconds, a string is "600", "90s", "1h30m", "2d".

    Units: s, m (minutes), h, d; each at most once; case-insensitive; spaces allowed.
    Raises ValueError with a message saying what is accepted. Does not check the sign.
    """
    if isinstance(value, bool):
        raise ValueError(f"must be a duration: {_DURATION_HELP}, not true/false")
    if isinstance(value, int | float | Decimal):
        try:
            return float(value)
        except OverflowError:
            raise ValueError("duration is too large") from None
    if not isinstance(value, str):
        raise ValueError(f"must be a duration: {_DURATION_HELP}")
    text = value.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    if not _DURATION_RE.fullmatch(text):
        raise ValueError(f"invalid duration {_show(value)}: use {_DURATION_HELP}")
    total = 0.0
    seen: set[str] = set()
    for number, unit in _DURATION_PART_RE.findall(text):
        if unit in seen:
            raise ValueError(f"invalid duration {_show(value)}: unit '{unit}' given twice")
        seen.add(unit)
        total += float(number) * _DURATION_UNITS[unit]
    return total


_DATE_RE = re.compile(r"\s*\d{4}-\d{2}-\d{2}")
_DEADLINE_HELP = "a UTC time such as 2025-07-01T18:00:00Z, or a duration after submit (36h, 2d)"


def _deadline_value(value: object) -> datetime | float:
    """An absolute time (a YAML timestamp or an ISO 8601 string, with its timezone) becomes an
    aware UTC datetime; anything else is read as a positive duration in seconds."""
    if isinstance(value, str) and _DATE_RE.match(value):
        text = value.strip()
        try:
            value = date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"invalid deadline {_show(value)}: use {_DEADLINE_HELP}") from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"deadline {value.isoformat()} has no timezone: end it with Z for UTC "
                "(2025-07-01T18:00:00Z) or give an offset (+02:00)"
            )
        return value.astimezone(UTC)
    if isinstance(value, date):
        raise ValueError(f"deadline {value.isoformat()} needs a time: use {_DEADLINE_HELP}")
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise ValueError(f"invalid deadline {_show(value)}: use {_DEADLINE_HELP}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"deadline must be a positive duration, got {_show(value)}")
    return seconds


def _not_bool(value: object) -> object:
    """Refuse YAML true/false where a number is expected (pydantic would read it as 1/0)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {_show(value)}")
    return value


def _spot_value(value: object) -> object:
    """Accept true, false, "auto" (and the strings "true"/"false", as flags may pass them)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "auto":
            return "auto"
        if word in ("true", "false"):
            return word == "true"
    raise ValueError(f'must be true, false or "auto", got {_show(value)}')


def _env_name(name: str) -> str:
    if not _ENV_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid variable name {_show(name)}: use letters, digits and '_', "
            "not starting with a digit"
        )
    if name.startswith("ORCH_"):
        raise ValueError(f"variable {name} is reserved: names starting with ORCH_ are set by orch")
    return name


def _env_value(value: object) -> object:
    """Strings stay; YAML numbers and booleans become strings ("8", "0.5", "true")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"must be a string, number or boolean, got {_show(value)}")


def _env_value_given(value: object) -> object:
    """An `env` value: as `_env_value`, and a missing one (YAML null) refused with a hint."""
    if value is None:
        raise ValueError(
            "has no value: give it one, or, for a token, list it under `secrets:` instead, "
            "where no value means the value of the same variable in the submitting shell"
        )
    return _env_value(value)


def _secret_value(value: object) -> object:
    """A `secrets` value: a string, number or boolean, never echoed in a message."""
    if isinstance(value, str | bool | int | float | Decimal):
        return _env_value(value)
    raise ValueError("must be a string, number or boolean (its value is not shown)")


_REFERENCE_RE = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}?|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def expand_references(text: str, environ: Mapping[str, str], *, unset_hint: str) -> str:
    """`text` with each `${NAME}` and `$NAME` replaced by NAME's value in `environ`, and each
    `$$` by one literal `$`; a `$` followed by anything else stays as it is.

    Raises ValueError naming the first NAME that `environ` does not hold (then `unset_hint`,
    what to do about it), or a `${...}` that is not a plain name (no shell defaults such as
    `${A:-x}`). The values put in are not expanded again.
    """

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("plain") or match.group("braced")
        if match.group("braced") is not None and (
            not match.group(0).endswith("}") or not _ENV_NAME_RE.fullmatch(name or "")
        ):
            raise ValueError(
                f"{_show(match.group(0))} is not a variable reference orch expands: write "
                "${NAME} or $NAME for a variable of the submitting shell, $$ for a literal $"
            )
        if name not in environ:
            raise ValueError(f"${{{name}}} is not set in the submitting shell: {unset_hint}")
        return environ[name]

    return _REFERENCE_RE.sub(replace, text)


Count = Annotated[int, BeforeValidator(_not_bool)]
"""A whole number; YAML true/false refused."""

MAX_DURATION_S = 366 * 86400.0
"""Longest duration accepted (366 days): longer ones overflow the scheduler's clock."""

MAX_USD = Decimal(1_000_000_000)
"""Largest amount of money accepted, so every amount stays finite wherever it is shown."""

Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False),
]
"""A positive duration in seconds, written as a number or "90s", "30m", "4h", "1h30m", "2d"."""

Usd = Annotated[Decimal, Field(gt=0, le=MAX_USD, allow_inf_nan=False)]
"""A positive amount of US dollars (exact decimal; "5", 5 and 5.0 all read as 5)."""

Deadline = Annotated[datetime | float, BeforeValidator(_deadline_value)]
"""An aware UTC datetime, or seconds after submit (> 0)."""

SpotPolicyName = Literal[
    "uniform-progress",
    "greedy",
    "on-demand",
    "spot-only",
    "uniform-progress-mz",
    "greedy-mz",
    "on-demand-mz",
    "spot-only-mz",
]
"""The policies of `orchestrator.spot.policies`, and their zone-aware forms (`-mz`,
`orchestrator.spot.zones`), which choose the zone too."""

_DEADLINE_POLICIES = ("uniform-progress", "greedy", "uniform-progress-mz", "greedy-mz")

EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value_given)]
SecretValue = Annotated[str, BeforeValidator(_secret_value)]


def _check_path_text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _check_node_path_text(value: str) -> str:
    _check_path_text(value)
    if value.startswith("~") and value != "~" and not value.startswith("~/"):
        raise ValueError(f"only '~' and '~/...' are supported, got {_show(value)}")
    return value


def _node_path(raw: str, home: PurePosixPath, relative_to: PurePosixPath) -> PurePosixPath:
    """Resolve a node path written in a spec: `~`/`~/x` under home, relative under relative_to."""
    if raw == "~":
        return home
    if raw.startswith("~/"):
        return home / raw[2:]
    path = PurePosixPath(raw)
    return path if path.is_absolute() else relative_to / path


def _local_path(raw: str, base_dir: Path) -> Path:
    """Resolve a local path written in a spec: `~` expanded, relative to base_dir, absolute."""
    path = Path(raw)
    # ~user that does not exist, or no home directory: keep the path literal
    with contextlib.suppress(RuntimeError):
        path = path.expanduser()
    if not path.is_absolute():
        path = base_dir / path
    try:
        return path.resolve()
    except RuntimeError:  # a symlink loop: keep the path as written; checks report it
        return Path(os.path.abspath(path))


# Showing values in messages


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return _show(value)


def _show(value: object) -> str:
    """A short one-line rendering of a YAML value for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return _kind(value)
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    return first.removeprefix("Value error, ")
