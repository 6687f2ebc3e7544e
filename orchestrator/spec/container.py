"""The spec's `container` section: the image a job's `setup` and `run` run in (pure).

    container:
      image: nvcr.io/nvidia/pytorch:24.05-py3     # any OCI reference; private registries too
      pull: missing                               # or always
      credentials: {username: team-bot, password_secret: REGISTRY_TOKEN}   # a `secrets` name
      shm_size: 16g                               # own /dev/shm (default: the node's, host IPC)
      devices: [/dev/infiniband]
      volumes: ["/scratch:/scratch:ro"]

The password is never in the spec: `password_secret` names an entry of the spec's `secrets`,
whose value the submitting shell gives and the ledger never keeps. An image in Amazon ECR
needs no credentials on AWS: the nodes log in with their instance role.

`parse_image_ref` reads a reference the way container runtimes do (registry, repository, tag,
digest) and raises ValueError with what is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from orchestrator.spec.values import EnvName, _show

DEFAULT_REGISTRY = "Docker Hub"  # where a reference without a registry is pulled from
DEFAULT_TAG = "latest"  # the tag of a reference with neither a tag nor a digest
MAX_NAME_CHARS = 255  # registry and repository together, as the runtimes count them
MAX_REF_CHARS = MAX_NAME_CHARS + 1 + 128 + 1 + 7 + 128  # name, ':' tag, '@' sha512 digest
MAX_OPTIONS = 16  # devices or volumes a spec may list

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # ASCII only, as the runtimes' \w
_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_DOMAIN_RE = re.compile(_DOMAIN)
_TAG_RE = re.compile(_TAG)
# the digests a runtime verifies: the algorithm's full length, lowercase hex
_DIGEST_RE = re.compile(r"(sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128})")
_ECR_RE = re.compile(r"[0-9]{12}\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
_SIZE_RE = re.compile(r"([0-9]{1,12})([bkmg]?)", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_REF_HELP = (
    "an image reference such as nvcr.io/nvidia/pytorch:24.05-py3, "
    "registry.example:5000/team/train:1.4 or pytorch/pytorch@sha256:<64 hex>"
)


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference."""

    registry: str | None  # host[:port]; None: the runtime's default registry (Docker Hub)
    repository: str  # path components, lowercase
    tag: str | None
    digest: str | None

    @property
    def ecr_region(self) -> str | None:
        """The AWS region of an Amazon ECR registry, or None for any other registry."""
        match = _ECR_RE.fullmatch(self.registry or "")
        return match.group(1) if match else None

    def __str__(self) -> str:
        name = f"{self.registry}/{self.repository}" if self.registry else self.repository
        tag = f":{self.tag}" if self.tag else ""
        return name + tag + (f"@{self.digest}" if self.digest else "")


def _looks_like_registry(first: str) -> bool:
    """Docker's rule: the first component names a registry when it has a '.' or a ':', is
    `localhost`, or has an uppercase letter (a repository never has one)."""
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def parse_image_ref(text: str) -> ImageRef:
    """Read `text` as `[registry/]repository[:tag][@digest]`; ValueError saying what is
    accepted when it is not one."""
    if not isinstance(text, str) or not text or text != text.strip():
        raise ValueError(f"invalid image {_show(text)}: use {_REF_HELP}")
    if len(text) > MAX_REF_CHARS:
        raise ValueError(f"image reference is {len(text)} characters: at most {MAX_REF_CHARS}")
    rest, _, digest = text.partition("@")
    if "@" in text and not _DIGEST_RE.fullmatch(digest):
        raise ValueError(
            f"invalid image digest {_show(digest)}: use sha256:<64 lowercase hex digits>"
        )
    registry: str | None = None
    first, slash, remainder = rest.partition("/")
    if slash and _looks_like_registry(first):
        if not _DOMAIN_RE.fullmatch(first):
            raise ValueError(f"invalid registry {_show(first)} in image {_show(text)}")
        registry, rest = first, remainder
    name, colon, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if colon and not _TAG_RE.fullmatch(tag):
        raise ValueError(
            f"invalid tag {_show(tag)} in image {_show(text)}: letters, digits, '_', '.', '-'"
        )
    if not _PATH_RE.fullmatch(name):
        raise ValueError(
            f"invalid repository {_show(name)} in image {_show(text)}: lowercase letters, digits "
            f"and separators ('.', '_', '-') between '/' parts; use {_REF_HELP}"
        )
    full = f"{registry}/{name}" if registry else name
    if len(full) > MAX_NAME_CHARS:
        raise ValueError(
            f"image name {_show(full)} is {len(full)} characters: at most {MAX_NAME_CHARS}"
        )
    return ImageRef(registry, name, tag or None, digest or None)


def size_bytes(text: str) -> int:
    """A size such as `16g`, `512m` or `1073741824` in bytes (units b, k, m, g: powers of 1024)."""
    match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"invalid size {_show(text)}: a number with k, m or g (16g, 512m)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def _absolute_clean(path: str, what: str) -> str:
    parts = path.split("/")
    if not path.startswith("/") or any(p in (".", "..") for p in parts[1:]):
        raise ValueError(f"{what} {_show(path)} must be an absolute path without '.' or '..'")
    if any(c in path for c in ",:") or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError(f"{what} {_show(path)} must not hold ',', ':' or a control character")
    return path


def _device_ok(device: str) -> str:
    if not _absolute_clean(device, "device").startswith("/dev/") or not device[5:].strip("/"):
        raise ValueError(f"device {_show(device)} must name a device under /dev/")
    return device


def _volume_ok(volume: str) -> str:
    parse_volume(volume)
    return volume


Device = Annotated[str, AfterValidator(_device_ok)]
Volume = Annotated[str, AfterValidator(_volume_ok)]


class RegistryLogin(BaseModel):
    """Credentials for a private registry: a user name and the name of a secret."""

    model_config = ConfigDict(extra="forbid")

    username: str = Field(description="the registry user (NGC: $oauthtoken; ECR needs none)")
    password_secret: EnvName = Field(
        description="name of the entry in `secrets` that holds the password or token"
    )

    @field_validator("username")
    @classmethod
    def _username_ok(cls, value: str) -> str:
        if not value or len(value) > 256 or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("must be 1-256 characters on one line")
        if ":" in value:  # a registry reads `user:password` up to the first ':'
            raise ValueError(f"{_show(value)} holds ':', which no registry user name can")
        return value


class ContainerSpec(BaseModel):
    """The image `setup` and `run` run in, on every node, and what the container may use."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(description="OCI image reference: [registry/]repository[:tag][@digest]")
    pull: Literal["missing", "always"] = Field(
        default="missing",
        description="missing: pull only when the node lacks the image (kept clusters reuse "
        "it); always: pull before every start (a moving tag)",
    )
    credentials: RegistryLogin | None = Field(
        default=None, description="registry login; the password comes from `secrets`"
    )
    shm_size: str | None = Field(
        default=None,
        description="the container's own /dev/shm of this size (16g); default: the node's "
        "/dev/shm, shared through host IPC",
    )
    devices: list[Device] = Field(
        default_factory=list, description="host devices given to the container (/dev/infiniband)"
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        description="extra host paths mounted in the container: HOST:CONTAINER[:ro]",
    )

    @field_validator("image")
    @classmethod
    def _image_ok(cls, value: str) -> str:
        parse_image_ref(value)
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm_ok(cls, value: str | None) -> str | None:
        if value is not None and size_bytes(value) < 1 << 20:
            raise ValueError(f"shm_size {_show(value)} is below 1m")
        return value

    @field_validator("devices")
    @classmethod
    def _devices_ok(cls, value: list[str]) -> list[str]:
        if len(value) > MAX_OPTIONS:
            raise ValueError(f"at most {MAX_OPTIONS} devices")
        return value

    @field_validator("volumes")
    @classmethod
    def _volumes_ok(cls, value: list[str]) -> list[str]:
        if len(value) > MAX_OPTIONS:
            raise ValueError(f"at most {MAX_OPTIONS} volumes")
        return value

    @property
    def ref(self) -> ImageRef:
        return parse_image_ref(self.image)

    def plan_document(self) -> dict[str, Any]:
        """What a dry run shows of the container (JSON data): the image as parsed, the pull
        policy and how the nodes log in to its registry. A password is named by its secret,
        never given."""
        ref = self.ref
        login: dict[str, str] | None = None
        if self.credentials is not None:
            login = {
                "with": "secret",
                "username": self.credentials.username,
                "password_secret": self.credentials.password_secret,
            }
        elif ref.ecr_region is not None:
            login = {"with": "node_role", "ecr_region": ref.ecr_region}
        return {
            "image": self.image,
            "registry": ref.registry or DEFAULT_REGISTRY,
            "repository": ref.repository,
            "tag": ref.tag if ref.tag or ref.digest else DEFAULT_TAG,
            "digest": ref.digest,
            "pull": self.pull,
            "login": login,
        }

    def plan_lines(self) -> list[str]:
        """`plan_document` as lines for a person."""
        doc = self.plan_document()
        ref = self.ref
        parts = [f"registry {doc['registry']}" + ("" if ref.registry else " (the default)")]
        parts.append(f"repository {doc['repository']}")
        if doc["tag"]:
            parts.append(f"tag {doc['tag']}" + ("" if ref.tag or ref.digest else " (none given)"))
        if doc["digest"]:
            parts.append(f"digest {doc['digest']}")
        pull = (
            "pulled only where a node lacks it (a kept cluster reuses it)"
            if self.pull == "missing"
            else "pulled before every start"
        )
        login = doc["login"]
        if login is None:
            said = "none (a public image, or one the node's runtime is logged in to)"
        elif login["with"] == "secret":
            said = (
                f"user {login['username']}, password from secret {login['password_secret']} "
                "(value hidden)"
            )
        else:
            said = f"the node's instance role (Amazon ECR in {login['ecr_region']}, on aws)"
        return [
            f"container {self.image}: {', '.join(parts)}",
            f"  pull {self.pull}: {pull}",
            f"  registry login: {said}",
        ]


def parse_volume(text: str) -> tuple[str, str, str]:
    """`HOST:CONTAINER[:ro|rw]` as (host, container, mode); ValueError when it is not one."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"invalid volume {_show(text)}: use HOST:CONTAINER or HOST:CONTAINER:ro")
    host = _absolute_clean(parts[0], "volume host path")
    container = _absolute_clean(parts[1], "volume container path")
    if not container.strip("/"):
        raise ValueError(f"invalid volume {_show(text)}: the container path must not be /")
    return host, container, parts[2] if len(parts) == 3 else "rw"
