"""Machine providers. `get_provider(name, settings)` imports only the one asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import SpecError
from orchestrator.spec.model import PROVIDER_NAMES

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.providers.base import Provider

__all__ = ["PROVIDER_NAMES", "get_provider"]


def get_provider(name: str, settings: Settings) -> Provider:
    """Build the provider called `name`; unknown names are a user error (exit 2)."""
    if name == "local":
        from orchestrator.providers.local.provider import LocalProvider

        return LocalProvider(settings)
    if name == "aws":
        from orchestrator.providers.aws.provider import AwsProvider

        return AwsProvider(settings)
    if name == "ssh":
        from orchestrator.providers.ssh.provider import SshProvider

        return SshProvider(settings)
    raise SpecError(
        f"unknown provider {name!r}", hint=f"choose one of: {', '.join(PROVIDER_NAMES)}"
    )
