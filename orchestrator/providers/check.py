"""What a provider needs on this machine, and whether it is there (`orch check`).

Each provider's checks live with it (`providers/local/prerequisites.py`,
`providers/aws/prerequisites.py`);
`check(name, settings)` runs one provider's, importing only that provider. A check looks and
never changes anything: no node is started, no cloud resource is made.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import SpecError
from orchestrator.spec.model import PROVIDER_NAMES

if TYPE_CHECKING:
    from orchestrator.config import Settings


@dataclass(frozen=True)
class Requirement:
    """One thing a provider needs, as found on this machine."""

    name: str  # what is needed, e.g. "rsync" or "AWS credentials"
    ok: bool  # whether it is there
    detail: str  # what was found ("/usr/bin/rsync") or what is wrong ("not on the PATH")
    fix: str = ""  # what to do when it is missing (empty when ok)
    needed: bool = True  # False: the provider works without it, in a lesser mode (see detail)


@dataclass(frozen=True)
class Readiness:
    """Everything one provider needs; ready when every needed requirement is there."""

    provider: str
    requirements: tuple[Requirement, ...]

    @property
    def ready(self) -> bool:
        return all(item.ok for item in self.requirements if item.needed)


def tool(name: str, why: str, fix: str, *, path: str | None = None) -> Requirement:
    """A program that must be on the PATH (`path`: that PATH instead of the environment's)."""
    found = shutil.which(name, path=path)
    if found:
        return Requirement(name, True, found)
    return Requirement(name, False, f"not on the PATH ({why})", fix)


def controller_tools(*, path: str | None = None) -> list[Requirement]:
    """What every provider needs on the controller's machine: rsync and ssh, which push the
    workdir and data to the nodes and pull checkpoints back."""
    return [
        tool("rsync", "syncs code and data to the nodes", "install rsync", path=path),
        tool("ssh", "carries rsync to the nodes", "install OpenSSH's client", path=path),
    ]


def check(name: str, settings: Settings, *, path: str | None = None) -> Readiness:
    """The readiness of provider `name` (unknown names are a usage error, exit 2)."""
    if name == "local":
        from orchestrator.providers.local.prerequisites import local_readiness

        return local_readiness(settings, path=path)
    if name == "aws":
        from orchestrator.providers.aws.prerequisites import aws_readiness

        return aws_readiness(settings, path=path)
    raise SpecError(
        f"unknown provider {name!r}", hint=f"choose one of: {', '.join(PROVIDER_NAMES)}"
    )
