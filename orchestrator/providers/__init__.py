"""Machine providers. `get_provider(name, settings)` imports only the one asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import SpecError

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.providers.base import Provider

PROVIDER_NAMES = ("local", "aws")


def get_provider(name: str, settings: Settings) -> Provider:
    """Build the provider called `name`; unknown names are a user error (exit 2)."""
    if name == "local":
        from orchestrator.providers.local import LocalProvider

        return LocalProvider(settings)
    if name == "aws":
        raise SpecError(
            "the aws provider is not available in this version",
            hint="use --provider local",
        )
    raise SpecError(
        f"unknown provider {name!r}", hint=f"choose one of: {', '.join(PROVIDER_NAMES)}"
    )
