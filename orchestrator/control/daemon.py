"""The detached controller of one job: `python -m orchestrator.control.daemon JOB_ID`.

Started by `orch submit --detach` and by any orch command that finds an unfinished job without
a controller. It takes the job's controller lock (or exits at once if another process holds
it), and on a shared ledger the job's controller lease too (`lease_keeper`; exits at once if
another machine's controller holds it; each of its writes about the job holds that lease:
`ledger.fencing`), then drives the job from whatever state the ledger records until it is
final. SIGTERM (what `orch cancel` sends) cancels the job gracefully. Output goes to
jobs/<id>/controller.log.
"""

from __future__ import annotations

import signal
import sys
from datetime import UTC, datetime
from typing import NoReturn

from orchestrator.config import load_settings
from orchestrator.control.process.controllers import (
    ControllerLock,
    controller_identity,
    load_job_record,
)
from orchestrator.control.process.lease_keeper import LeaseKeeper
from orchestrator.control.run.runner import JobRunner, RunnerOptions
from orchestrator.control.run.unrecorded import finish_unrecorded, has_unrecorded
from orchestrator.control.verbs.notify import notify_end
from orchestrator.errors import IdentityMismatch, LedgerError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger, ledger_engine
from orchestrator.node.progress import Metrics
from orchestrator.providers import get_provider


class LogReporter:
    """Writes what a foreground run would show to the controller's log, with UTC times."""

    def _write(self, text: str) -> None:
        print(f"{datetime.now(UTC).isoformat(timespec='seconds')} {text}", flush=True)

    def phase(self, text: str) -> None:
        self._write(f"phase: {text}")

    def metrics(self, metrics: Metrics) -> None:
        pass  # progress is in the ledger and in the node logs

    def line(self, text: str) -> None:
        self._write(text)


def _cancel(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m orchestrator.control.daemon JOB_ID", file=sys.stderr)
        return 2
    job_id = argv[1]
    settings = load_settings()
    lock = ControllerLock(settings, job_id)
    if not lock.acquire():
        return 0  # another controller drives this job
    keeper: LeaseKeeper | None = None
    try:
        signal.signal(signal.SIGTERM, _cancel)
        signal.signal(signal.SIGINT, _cancel)
        ledger = Ledger(ledger_engine(settings))
        # A stop whose records the ledger refused: write them, and never drive the job again.
        finish_unrecorded(settings.home, ledger, job_id)
        if has_unrecorded(settings.home, job_id):
            print(
                f"{job_id}: its stop is not written yet (the ledger refuses writes)",
                file=sys.stderr,
            )
            return LedgerError.exit_code
        job = ledger.get_job(job_id)
        if JobState(job.state).is_final:
            return 0
        if settings.ledger.shared:  # other machines' controllers are kept out by the lease
            keeper = LeaseKeeper(settings, ledger, job_id)
            claim = keeper.take()
            if not claim.taken:
                held = claim.lease.holder if claim.lease else "another controller"
                LogReporter().line(f"not driving {job_id}: its lease is held by {held}")
                keeper = None
                return 0
            keeper.start()
            ledger = keeper.fenced(ledger)  # each write about the job holds the lease
        job = ledger.update_job(
            job_id, controller=controller_identity(keeper.holder if keeper else None)
        )
        runner = JobRunner(
            job,
            load_job_record(settings, job_id),
            settings=settings,
            ledger=ledger,
            provider=get_provider(job.provider, settings),
            reporter=LogReporter(),
            options=RunnerOptions.from_settings(settings.controller),
        )
        try:
            outcome = runner.run()
        except IdentityMismatch as exc:  # the job is left as it was, for the right controller
            LogReporter().line(f"refused: {exc}")
            return exc.exit_code
        finally:  # after teardown; nothing runs for a job that is not final (a refusal)
            notified = notify_end(settings, ledger, job_id)
            if notified is not None:
                LogReporter().line(f"notify hook: exit {notified.exit_code}")
        return outcome.exit_code
    finally:
        if keeper is not None:
            keeper.stop()
        lock.release()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
