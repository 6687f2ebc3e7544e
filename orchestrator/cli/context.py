"""What every command opens first, imported only when a command runs.

The configuration (pydantic, the spec) and the ledger (SQLModel) are most of a command's
start-up; the app and its sub-apps import them through here, inside the commands, so that
building the app (`orch --help`, `orch --version`, completion) pays for neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.ledger.store import Ledger


def load_settings() -> Settings:
    """The configuration of this ORCH_HOME (`orchestrator.config.load_settings`)."""
    from orchestrator.config import load_settings as load

    return load()


def open_ledger(settings: Settings) -> Ledger:
    """The ledger of `settings`, created or brought up to date when needed."""
    from orchestrator.ledger.store import Ledger, make_engine

    return Ledger(make_engine(settings.db_path))
