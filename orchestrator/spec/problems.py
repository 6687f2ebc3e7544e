"""The problems of a job spec and how they are told: each at its dotted path and YAML line
(or the flag it came from), with what is expected and, for an unknown field, the nearest
known one. `orchestrator.spec.loading` finds them; this module turns them into the one
`SpecError` message.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic_core import ErrorDetails

from orchestrator.spec.model import (
    OVERRIDE_FLAGS,
    Budget,
    CheckpointSpec,
    ContainerSpec,
    DataMount,
    JobSpec,
    OutputMount,
    ProgressSpec,
    Recovery,
    RegistryLogin,
    Resources,
)
from orchestrator.spec.values import MAX_DURATION_S, FieldError, _one_line, _show

Loc = tuple[str | int, ...]

MAX_SHOWN_PROBLEMS = 50  # a message lists at most this many problems, then says how many more


def _fields_of(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


_KNOWN_FIELDS: dict[tuple[str, ...], list[str]] = {
    (): _fields_of(JobSpec),
    ("resources",): _fields_of(Resources),
    ("checkpoint",): _fields_of(CheckpointSpec),
    ("budget",): _fields_of(Budget),
    ("recovery",): _fields_of(Recovery),
    ("progress",): _fields_of(ProgressSpec),
    ("container",): _fields_of(ContainerSpec),
    ("container", "credentials"): _fields_of(RegistryLogin),
    ("data", "[]"): _fields_of(DataMount),
    ("outputs", "[]"): _fields_of(OutputMount),
}


@dataclass(frozen=True)
class _Problem:
    """One thing wrong with the spec, before it is rendered as a line."""

    loc: Loc  # where: dotted path parts (str) and list indexes (int)
    message: str  # what is wrong and what is expected
    unknown: bool = False  # an unknown field: rendered "unknown field `a.b`"


# --------------------------------------------------------------------------------------------
# Messages


def _problem_from_error(err: ErrorDetails) -> _Problem:
    """Turn one pydantic error into a short problem at a clean location."""
    loc: list[str | int] = []
    is_key = False
    for part in err["loc"]:
        if part == "[key]":
            is_key = True
        else:
            loc.append(part)
    kind = err["type"]
    error = (err.get("ctx") or {}).get("error")
    if isinstance(error, FieldError):
        loc.extend(error.loc)
    if kind == "invalid_key" and loc:
        loc[-1] = _show(err["input"])  # the key as written: `true`, not pydantic's `1`
    elif is_key and loc:
        loc[-1] = str(loc[-1])  # a mapping key, not a list index
    if kind == "extra_forbidden":
        return _Problem(tuple(loc), _unknown_hint(tuple(loc)), unknown=True)
    message = _describe(err)
    if is_key and kind != "value_error":
        message = f"variable name {message}"
    return _Problem(tuple(loc), message)


_PLAIN_MESSAGES = {
    "missing": "required field is missing",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "decimal_type": "must be a number",
    "decimal_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping (key: value)",
    "model_type": "must be a mapping (key: value)",
    "model_attributes_type": "must be a mapping (key: value)",
    "list_type": "must be a list",
    "invalid_key": "keys must be strings",
    "string_too_short": "must not be empty",
}

_BOUND_MESSAGES = {
    "greater_than": ("gt", "must be > {}"),
    "greater_than_equal": ("ge", "must be >= {}"),
    "less_than": ("lt", "must be < {}"),
    "less_than_equal": ("le", "must be <= {}"),
    "string_too_long": ("max_length", "must be at most {} characters"),
}


def _describe(err: ErrorDetails) -> str:
    """A short one-line statement of what was expected (and what was given)."""
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return _one_line(str(ctx["error"]))
    if kind in _BOUND_MESSAGES:
        name, template = _BOUND_MESSAGES[kind]
        message = template.format(_bound(ctx.get(name, "?")))
    else:
        message = _PLAIN_MESSAGES.get(kind) or _one_line(err["msg"])
    if kind == "missing":
        return message
    return f"{message}, got {_show(err['input'])}"


def _bound(value: object) -> str:
    """A limit as a person writes it: 31622400.0 -> '31622400 s (366 days)', 1.0 -> '1'."""
    if isinstance(value, float) and value.is_integer():
        if value == MAX_DURATION_S:
            return f"{int(value)} s ({int(value) // 86400} days)"
        return str(int(value))
    return str(value)


def _unknown_hint(loc: Loc) -> str:
    """'did you mean `x`?' for a close known name, else the list of known names."""
    parent = tuple("[]" if isinstance(p, int) else p for p in loc[:-1])
    known = _KNOWN_FIELDS.get(parent)
    if not known:
        return ""
    suggestion = _suggest(str(loc[-1]), known)
    if suggestion:
        return f"did you mean `{suggestion}`?"
    return "expected one of: " + ", ".join(known)


def _suggest(name: str, known: list[str]) -> str | None:
    """The known field name most likely meant by `name`, if any is close."""
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    if key in known:
        return key
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    if len(key) < 3:
        return None
    for candidates in (
        [k for k in known if k.startswith(key)],
        [k for k in known if key in k or k in key],
    ):
        if len(candidates) == 1:
            return candidates[0]
    return None


def _render(
    problems: list[_Problem],
    source: Path,
    root: yaml.Node | None,
    applied: dict[tuple[str, ...], str],
) -> str:
    """One message: a header, then each problem on its own line (a single one stays inline)."""
    ranked = sorted(  # the file's problems by line, then the command line's
        problems,
        key=lambda p: (_override_for(p.loc, applied) is not None, _line_of(root, p.loc) or 0),
    )
    lines = [_render_one(p, root, applied) for p in ranked[:MAX_SHOWN_PROBLEMS]]
    if len(ranked) > MAX_SHOWN_PROBLEMS:
        lines.append(f"... and {len(ranked) - MAX_SHOWN_PROBLEMS} more")
    if len(ranked) == 1:
        return f"invalid job spec {source}: {lines[0]}"
    return f"invalid job spec {source} ({len(ranked)} problems):\n" + "\n".join(
        f"  {line}" for line in lines
    )


def _render_one(
    problem: _Problem, root: yaml.Node | None, applied: dict[tuple[str, ...], str]
) -> str:
    dotted = _dotted(problem.loc)
    override = _override_for(problem.loc, applied)
    if override is not None:
        parts, key = override
        where = _flag(key)
        if len(problem.loc) > len(parts):
            where += f" ({dotted})"
        if problem.unknown:
            tail = f"; {problem.message}" if problem.message else ""
            return f"unknown field `{dotted}` (from the command line){tail}"
        return f"{where}: {problem.message} (from the command line)"
    line = _line_of(root, problem.loc)
    at = f" (line {line})" if line else ""
    if problem.unknown:
        tail = f"; {problem.message}" if problem.message else ""
        return f"unknown field `{dotted}`{at}{tail}"
    return f"{dotted or '(top level)'}{at}: {problem.message}"


def _override_for(
    loc: Loc, applied: dict[tuple[str, ...], str]
) -> tuple[tuple[str, ...], str] | None:
    """The longest applied override whose path is a prefix of `loc`, if any."""
    best: tuple[tuple[str, ...], str] | None = None
    text = tuple(str(p) for p in loc)
    for parts, key in applied.items():
        if text[: len(parts)] == parts and (best is None or len(parts) > len(best[0])):
            best = (parts, key)
    return best


def _flag(key: str) -> str:
    section, _, name = key.partition(".")
    if section in _ASSIGNMENT_FLAGS and name:
        return f"{_ASSIGNMENT_FLAGS[section]} {name}"
    return OVERRIDE_FLAGS.get(key, f"override {key}")


_ASSIGNMENT_FLAGS = {"env": "--env", "secrets": "--secret"}


def _line_of(root: yaml.Node | None, loc: Loc | tuple[str, ...]) -> int | None:
    """1-based line of the deepest node along `loc` that exists in the YAML tree."""
    if root is None:
        return None
    node: yaml.Node = root
    line = root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found: tuple[yaml.Node, yaml.Node] | None = None
            for key, value in node.value:  # the last duplicate wins, as in the loaded data
                if _key_matches(key, part):
                    found = (key, value)
            if found is None:
                break
            line = found[0].start_mark.line + 1
            node = found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _key_matches(key: yaml.Node, part: str | int) -> bool:
    """Whether a YAML mapping key node is the key `part` of the loaded data."""
    if not isinstance(key, yaml.ScalarNode):
        return False
    if key.value == str(part):
        return True
    if key.tag == "tag:yaml.org,2002:str":
        return False  # a string key is its own text; only other scalars need building
    try:
        loaded = yaml.constructor.SafeConstructor().construct_object(key)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError):
        return False
    return str(part) in (str(loaded), _show(loaded))


def _dotted(loc: Loc) -> str:
    """('data', 0, 'src') -> 'data[0].src'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
