"""What every command opens first, imported only when a command runs.

The configuration (pydantic, the spec) and the ledger (SQLModel) are most of a command's
start-up; the app and its sub-apps import them through here, inside the commands, so that
building the app (`orch --help`, `orch --version`, completion) pays for neither. The list
views (`orch status`, `orch cost`) and the checks before every command need neither when there
is nothing to check: they read ORCH_HOME (`orch_home`) and the ledger's read-only view
(`ledger_view`), and load the settings only when some are given (`check_settings`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.ledger.store import Ledger
    from orchestrator.ledger.view import LedgerView


def load_settings() -> Settings:
    """The configuration of this ORCH_HOME (`orchestrator.config.load_settings`)."""
    from orchestrator.config import load_settings as load

    return load()


def open_ledger(settings: Settings) -> Ledger:
    """The ledger of `settings` (`ledger.url`, else the SQLite file), created or brought up
    to date when needed."""
    from orchestrator.ledger.store import Ledger, ledger_engine

    return Ledger(ledger_engine(settings))


def orch_home() -> Path:
    """ORCH_HOME as `load_settings` finds it (`Settings.home`), without reading the rest of
    the configuration: `$ORCH_HOME`, else ~/.orch."""
    return Path(os.environ.get("ORCH_HOME") or Path.home() / ".orch").expanduser().absolute()


def check_settings() -> None:
    """Stop on invalid settings (ConfigError), as every command does, loading them only when
    there is something to check: ORCH_HOME/config.yaml or an ORCH_* variable besides ORCH_HOME.
    Without either, the settings are the defaults, which are valid."""
    given = any(
        name.startswith("ORCH_") and name != "ORCH_HOME" and value
        for name, value in os.environ.items()
    )
    if given or (orch_home() / "config.yaml").exists():
        load_settings()


def ledger_view() -> LedgerView | None:
    """The read-only view of this ORCH_HOME's ledger: the database of `ledger.url`
    (ORCH_DATABASE_URL, or config.yaml, which `check_settings` has read already), else the
    file `Settings.db_path`; None when it does not apply and the command must `open_ledger`
    (see `orchestrator.ledger.view`): the ledger is not one the view can read as is."""
    from orchestrator.ledger.view import open_url_view, open_view

    url = ledger_url()
    return open_view(orch_home() / "orch.db") if url is None else open_url_view(url)


def ledger_url() -> str | None:
    """`ledger.url` (ORCH_DATABASE_URL, or config.yaml), loading the settings only when one
    of them may give it; None: the ledger is ORCH_HOME's own file."""
    if os.environ.get("ORCH_DATABASE_URL") or (orch_home() / "config.yaml").exists():
        return load_settings().ledger.url or None
    return None


def unfinished_job_ids(ledger: Ledger) -> list[str]:
    """The ids of the ledger's unfinished jobs (the only ones that can need a controller), in
    one read of ids and states: no model object for each of a shared ledger's many jobs."""
    from orchestrator.job_state import JobState
    from orchestrator.ledger.view import LedgerView

    with LedgerView.of_engine(ledger.engine) as view:
        return [job_id for job_id, state in view.job_states() if not JobState(state).is_final]


def reports_without_revival() -> list[str] | None:
    """What the check before every command says when no unfinished job needs a new controller
    here, found through the ledger's read model alone: nothing on a ledger of this ORCH_HOME's
    own; on a shared ledger (`ledger.url`), a line for each job stranded on another machine
    (`adoption.Stranded.line`). None when some job needs a controller from here, or the view
    does not apply: `supervision.revive` must look with the configuration and the ledger."""
    from orchestrator.control.process.liveness import controller_lost
    from orchestrator.job_state import JobState

    view = ledger_view()
    if view is None:
        return None
    with view:
        unfinished = [job_id for job_id, state in view.job_states() if not JobState(state).is_final]
        if not unfinished:
            return []
        if ledger_url() is None:
            jobs = orch_home() / "jobs"  # Settings.job_dir
            return None if any(controller_lost(jobs / job_id) for job_id in unfinished) else []
        from orchestrator.control.process.adoption import plan_adoption

        live = {job.id: job for job in view.live_jobs()}  # in `unfinished`'s order, as revive
        jobs_ = [live[job_id] for job_id in unfinished if job_id in live]
        adoption = plan_adoption(load_settings(), view, jobs_)
    return None if adoption.revive else [stranded.line() for stranded in adoption.stranded]


def no_controller_lost() -> bool:
    """True when no unfinished job needs a new controller from here, found through the
    ledger's read model alone (`reports_without_revival`, whose lines it prints on stderr
    first); False when some job does, or the view does not apply: `revive_controllers` must
    look with the configuration and the ledger."""
    reports = reports_without_revival()
    if reports is None:
        return False
    if reports:
        from orchestrator.cli.output import make_console

        for report in reports:
            make_console(stderr=True).print(report, highlight=False, markup=False)
    return True
