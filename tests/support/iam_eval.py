"""An offline evaluator of IAM identity policies: does this policy allow this request?

Enough of IAM's rules for orch's policies, and strict where it is not: `Allow` statements only
(none of orch's policies denies), actions matched case-insensitively with wildcards, resources
by ARN with wildcards and `${...}` policy variables taken from the request's context, and the
condition operators below (with `...IfExists` and `ForAllValues:`/`ForAnyValue:`). An operator
it does not know raises, so a policy never passes a test by being misunderstood.

A request is one authorization EC2, IAM or S3 makes for an API call: one action on one resource
with its condition keys (`aws_calls.authorizations` builds them from recorded calls).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Value = str | tuple[str, ...]


@dataclass(frozen=True)
class Request:
    """One authorization: `action` on `resource` ("*" where the action takes none)."""

    action: str  # "ec2:RunInstances"
    resource: str  # an ARN, or "*"
    context: Mapping[str, Value] = field(default_factory=dict)  # condition keys -> value(s)
    call: str = ""  # the API call it is made for, for messages

    def key(self, name: str) -> Value | None:
        """The context key `name` (keys are case-insensitive), None when absent."""
        wanted = name.lower()
        for key, value in self.context.items():
            if key.lower() == wanted:
                return value
        return None

    def __str__(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in sorted(self.context.items()))
        return f"{self.action} on {self.resource} [{keys}] ({self.call})"


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _wildcard(pattern: str, *, case: bool) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), 0 if case else re.IGNORECASE)


_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def _substitute(pattern: str, request: Request) -> str | None:
    """`pattern` with its policy variables replaced from the request; None when one is not
    in the request (IAM then does not match the statement)."""
    missing = False

    def value(found: re.Match[str]) -> str:
        nonlocal missing
        got = request.key(found.group(1))
        if not isinstance(got, str):
            missing = True
            return ""
        return got

    out = _VARIABLE.sub(value, pattern)
    return None if missing else out


def _matches_any(patterns: Iterable[str], text: str, request: Request, *, case: bool) -> bool:
    for pattern in patterns:
        resolved = _substitute(pattern, request)
        if resolved is not None and _wildcard(resolved, case=case).fullmatch(text):
            return True
    return False


def _compare(op: str, policy_value: str, value: str, request: Request) -> bool:
    resolved = _substitute(policy_value, request)
    if resolved is None:
        return False
    if op in ("StringEquals", "ArnEquals"):
        return value == resolved
    if op == "StringEqualsIgnoreCase":
        return value.lower() == resolved.lower()
    if op in ("StringLike", "ArnLike"):
        return _wildcard(resolved, case=True).fullmatch(value) is not None
    if op == "Bool":
        return value.lower() == resolved.lower()
    raise ValueError(f"condition operator {op} is not known to this evaluator")


_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike",
            "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}  # fmt: skip


def _condition(operator: str, key: str, wanted: str | list[str], request: Request) -> bool:
    values = _listed(wanted)
    qualifier, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    got = request.key(key)
    if op == "Null":
        [text] = values
        return (got is None) == (text.lower() == "true")
    if got is None:
        # absent: ForAllValues holds (an empty set), IfExists holds, everything else fails
        return qualifier == "ForAllValues" or if_exists
    negated = op in _NEGATED
    base = _NEGATED.get(op, op)

    def one(item: str) -> bool:
        hit = any(_compare(base, v, item, request) for v in values)
        return not hit if negated else hit

    items = list(got) if isinstance(got, tuple) else [got]
    if qualifier == "ForAllValues":
        return all(one(item) for item in items)
    if qualifier == "ForAnyValue":
        return any(one(item) for item in items)
    if qualifier:
        raise ValueError(f"condition qualifier {qualifier} is not known to this evaluator")
    if isinstance(got, tuple):
        raise ValueError(f"{key} has several values: {operator} needs ForAllValues/ForAnyValue")
    return one(got)


def statement_allows(statement: Mapping[str, object], request: Request) -> bool:
    """Whether this one statement allows `request`."""
    if statement.get("Effect") != "Allow":
        raise ValueError(f"only Allow statements are known to this evaluator: {statement}")
    if "NotAction" in statement or "NotResource" in statement or "Principal" in statement:
        raise ValueError(f"an identity policy statement of Action and Resource only: {statement}")
    actions = _listed(statement["Action"])  # type: ignore[arg-type]
    if not _matches_any(actions, request.action, request, case=False):
        return False
    resources = _listed(statement["Resource"])  # type: ignore[arg-type]
    if not _matches_any(resources, request.resource, request, case=True):
        return False
    conditions = statement.get("Condition") or {}
    assert isinstance(conditions, Mapping)
    return all(
        _condition(operator, key, wanted, request)
        for operator, block in conditions.items()
        for key, wanted in block.items()
    )


def allows(policy: Mapping[str, object], request: Request) -> bool:
    """Whether any statement of `policy` allows `request`."""
    statements = policy["Statement"]
    assert isinstance(statements, list)
    return any(statement_allows(s, request) for s in statements)


def refused(policy: Mapping[str, object], requests: Iterable[Request]) -> list[str]:
    """The requests `policy` does not allow, described one per line (empty: all allowed)."""
    return [str(r) for r in requests if not allows(policy, r)]
