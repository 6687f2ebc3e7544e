"""Where on a cloud a job's nodes may go, as the spec says it (pure validators).

`resources.instance_type`, `region` and `zone` take one value or a list (a list of types is in
order of preference), `image` an AMI id or an AMI name pattern, and `ports` the ports to open to
the submitting machine's address. Each is checked here, so a typo is an error that names the
field before anything is asked of a cloud; whether a type exists in a region is the provider's
question.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_INSTANCE_TYPE_RE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")
_REGION_RE = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}")
_ZONE_RE = re.compile(r"([a-z]{2}(?:-[a-z]+)+-\d{1,2})[a-z]")
_AMI_ID_RE = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_AMI_NAME_RE = re.compile(r"[A-Za-z0-9()./_*\- ]{3,128}")
_PORTS_RE = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?")


def _one_or_many(value: object, what: str, pattern: re.Pattern[str], example: str) -> object:
    """A string or a list of strings, each matching `pattern`, as a list without repeats."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ValueError(f"give one {what} or a list of them, e.g. {example}")
    seen: list[str] = []
    for item in items:
        if not isinstance(item, str) or not pattern.fullmatch(item):
            raise ValueError(f"{item!r} is not {what}; e.g. {example}")
        if item in seen:
            raise ValueError(f"{item!r} is listed twice")
        seen.append(item)
    return seen


def _instance_types(value: object) -> object:
    return _one_or_many(value, "an instance type", _INSTANCE_TYPE_RE, "g5.xlarge")


def _regions(value: object) -> object:
    return _one_or_many(value, "a region", _REGION_RE, "us-east-1")


def _zones(value: object) -> object:
    return _one_or_many(value, "an availability zone", _ZONE_RE, "us-east-1a")


def _image(value: object) -> object:
    is_id = isinstance(value, str) and _AMI_ID_RE.fullmatch(value)
    is_name = isinstance(value, str) and not value.startswith("ami-")
    if not (is_id or (is_name and _AMI_NAME_RE.fullmatch(value))):
        raise ValueError(
            f"{value!r} is neither an AMI id (ami- and 8 or 17 hex digits) nor an AMI name "
            "pattern (3-128 of letters, digits, ( ) . / _ - * and spaces, e.g. "
            "'Deep Learning OSS Nvidia Driver AMI GPU PyTorch*')"
        )
    return value


def _ports(value: object) -> object:
    """Ports as "N" or "A-B" strings: from an int, a string or a list of them."""
    items = value if isinstance(value, list) else [value]
    ports: list[str] = []
    for item in items:
        text = str(item) if isinstance(item, int) and not isinstance(item, bool) else item
        match = _PORTS_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"{item!r} is not a port or a range of ports, e.g. 6006 or 8000-8010")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"{item!r}: ports go from 1 to 65535, the low end first")
        if low <= 22 <= high:
            raise ValueError(f"{item!r}: port 22 is orch's own SSH, always open to this machine")
        ports.append(str(low) if low == high else f"{low}-{high}")
    if len(set(ports)) != len(ports):
        raise ValueError("a port is listed twice")
    return ports


def zone_region(zone: str) -> str:
    """The region of an availability zone (`us-east-1a` -> `us-east-1`)."""
    match = _ZONE_RE.fullmatch(zone)
    return match.group(1) if match else zone


def port_range(port: str) -> tuple[int, int]:
    """("8000-8010") -> (8000, 8010); ("6006") -> (6006, 6006)."""
    low, _, high = port.partition("-")
    return int(low), int(high or low)


InstanceTypes = Annotated[list[str], BeforeValidator(_instance_types)]
Regions = Annotated[list[str], BeforeValidator(_regions)]
Zones = Annotated[list[str], BeforeValidator(_zones)]
Image = Annotated[str, BeforeValidator(_image)]
Ports = Annotated[list[str], BeforeValidator(_ports)]
