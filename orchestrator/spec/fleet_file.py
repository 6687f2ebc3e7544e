"""What `orch fleet add` is given: a fleet's name, its machines' logins, the user's key and the
fleet's price, from flags or from a YAML file (`--file`) with the same fields:

```yaml
name: gpu-lab                         # or the NAME argument
hosts: [ubuntu@10.0.0.5, ubuntu@10.0.0.6:2222]
identity: ~/.ssh/id_ed25519           # the user's private key; orch reads it, never copies it
known_hosts: ~/.ssh/known_hosts       # optional: pins each host's key from this file
proxy_jump: ubuntu@bastion.example:22 # optional: every host is reached through this one
price_per_hour: "2.40"                # optional, USD per host-hour; or price_per_gpu_hour
```

`FleetFile` validates it all (unknown fields, bad logins, a negative price, both prices);
`load_fleet_file` reads a file and `fleet_from_flags` the flags, both raising one `SpecError`
that names every bad field. Paths are absolute once validated (a file's relative ones are
taken from the file's folder). No I/O but reading the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.errors import SpecError

MAX_FILE_BYTES = 64 * 1024
MAX_HOSTS = 256
MAX_PRICE = Decimal("100000")  # USD per hour: more is a typo
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")
_IPV6_RE = re.compile(r"^\[([0-9A-Fa-f:.]{2,45})\]$")


@dataclass(frozen=True)
class Login:
    """`user@address[:port]`, parsed. `address` is a hostname, IPv4, or IPv6 (no brackets)."""

    user: str
    address: str
    port: int = 22

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.user}@{host}:{self.port}"


def parse_login(text: str) -> Login:
    """`USER@ADDR[:PORT]` (an IPv6 address in brackets: `u@[::1]:22`); ValueError says why not."""
    user, at, rest = text.strip().partition("@")
    if not at or not _USER_RE.match(user):
        raise ValueError(f"{text!r} is not USER@ADDR[:PORT] (a login name, then @)")
    port_text = "22"
    if rest.startswith("["):
        host, close, after = rest.partition("]")
        if not close or (after and not after.startswith(":")):
            raise ValueError(f"{text!r}: an IPv6 address is written [ADDR] or [ADDR]:PORT")
        address, port_text = host[1:], after[1:] or "22"
        if not _IPV6_RE.match(f"[{address}]"):
            raise ValueError(f"{text!r}: {address!r} is not an IPv6 address")
    else:
        address, colon, port_part = rest.partition(":")
        port_text = port_part if colon else "22"
        if not _HOSTNAME_RE.match(address):
            raise ValueError(f"{text!r}: {address!r} is not a hostname or IPv4 address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number in 1..65535")
    return Login(user, address, int(port_text))


def _price(value: object) -> Decimal | None:
    if value is None:
        return None
    try:
        price = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a price in USD (e.g. 2.40)") from None
    if not price.is_finite() or price < 0 or price > MAX_PRICE:
        raise ValueError(f"{value!r}: a price is a number of USD from 0 to {MAX_PRICE}")
    return price


class FleetFile(BaseModel):
    """A fleet to add, as the YAML file or the flags give it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hosts: list[str] = Field(min_length=1, max_length=MAX_HOSTS)
    identity: Path
    known_hosts: Path | None = None
    proxy_jump: str | None = None
    price_per_hour: Decimal | None = None
    price_per_gpu_hour: Decimal | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(
                "a fleet name is 1-63 lowercase letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        logins = [parse_login(text) for text in value]
        seen: set[tuple[str, int]] = set()
        for login in logins:
            if (login.address, login.port) in seen:
                raise ValueError(f"{login.address}:{login.port} is given twice")
            seen.add((login.address, login.port))
        return [str(login) for login in logins]

    @field_validator("proxy_jump")
    @classmethod
    def _jump(cls, value: str | None) -> str | None:
        return None if value is None else str(parse_login(value))

    @field_validator("price_per_hour", "price_per_gpu_hour", mode="before")
    @classmethod
    def _prices(cls, value: object) -> Decimal | None:
        return _price(value)

    @model_validator(mode="after")
    def _one_price(self) -> FleetFile:
        if self.price_per_hour is not None and self.price_per_gpu_hour is not None:
            raise ValueError("give price_per_hour (per host) or price_per_gpu_hour, not both")
        return self

    def logins(self) -> list[Login]:
        return [parse_login(text) for text in self.hosts]

    @property
    def price(self) -> tuple[Decimal, str]:
        """(USD per hour, unit "host" or "gpu"); no price given: 0 per host."""
        if self.price_per_gpu_hour is not None:
            return self.price_per_gpu_hour, "gpu"
        return self.price_per_hour or Decimal(0), "host"


def fleet_from_flags(fields: dict[str, Any], base: Path) -> FleetFile:
    """The fleet of the command's flags (None values left out); paths taken from `base`."""
    given = {k: v for k, v in fields.items() if v is not None}
    return _validated(given, base, "the flags do not describe a fleet")


def load_fleet_file(path: Path, name: str | None) -> FleetFile:
    """The fleet in the YAML file at `path`; `name` (the NAME argument) fills or must match
    the file's `name`."""
    try:
        data = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise SpecError(f"cannot read the fleet file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"the fleet file {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        raw = yaml.safe_load(data.decode("utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecError(f"the fleet file {path} is not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"the fleet file {path} must be a mapping (name:, hosts:, identity:, ...)")
    if name is not None and raw.setdefault("name", name) != name:
        raise SpecError(
            f"the fleet file {path} names the fleet {raw['name']!r}, the command {name!r}",
            hint="leave out NAME, or make the two agree",
        )
    return _validated(raw, path.parent, f"the fleet file {path} does not describe a fleet")


def _validated(raw: dict[str, Any], base: Path, where: str) -> FleetFile:
    for key in ("identity", "known_hosts"):
        value = raw.get(key)
        if isinstance(value, str | Path):
            raw[key] = (base / Path(value).expanduser()).absolute()
    try:
        return FleetFile.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"  {'.'.join(str(p) for p in err['loc']) or 'fleet'}: {_message(err['msg'])}"
            for err in exc.errors()
        ]
        raise SpecError(f"{where}:\n" + "\n".join(problems)) from None


def _message(msg: str) -> str:
    return msg.removeprefix("Value error, ")
