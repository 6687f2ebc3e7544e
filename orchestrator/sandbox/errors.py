"""The sandbox's error: it could not start, or could not build, end or reach what it runs."""

from __future__ import annotations

from orchestrator.errors import ProviderError


class SandboxError(ProviderError):
    """The sandbox could not start, build or end a host, or could not be reached (exit 3)."""
