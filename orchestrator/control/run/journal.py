"""The job's journal: every state change the runner makes, by name, and the leases it opens.

Each change is written to the ledger (the job's row, then its event) before the runner does
what it announces, so a controller killed at any line leaves a trail to reconcile from. A
change `orchestrator.job_state.TRANSITIONS` does not allow raises `IllegalTransition` and
writes nothing.
"""

from __future__ import annotations

import time
from datetime import datetime

from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.options import Reporter
from orchestrator.job_state import JobState, may_follow
from orchestrator.ledger.store import Job, Lease, Ledger, ProgressSampleRecord, utcnow
from orchestrator.node.progress import Metrics
from orchestrator.providers.base import Instance
from orchestrator.spot.inputs import PROGRESS_EVENT


class IllegalTransition(RuntimeError):
    """The runner asked for a state change the transition table does not allow (a bug)."""


class Journal:
    """Writes the state changes and the progress of one job; `job` is its row as last
    written, `last_step` the newest step the run reported (each state's event carries it)."""

    def __init__(self, job: Job, ledger: Ledger, reporter: Reporter) -> None:
        self.job = job
        self.ledger = ledger
        self.reporter = reporter
        self.last_step: int | None = None
        self._awaiting_progress = False  # a run started and has not reported progress yet
        self._step_saved = 0.0
        self._latest: Metrics | None = None  # the newest progress line read
        self._sampled_step: int | None = None  # the step of the last progress sample written

    @property
    def state(self) -> JobState:
        return JobState(self.job.state)

    def check(self, state: JobState) -> None:
        """Raise `IllegalTransition` unless the job may go from its state to `state`."""
        if not may_follow(self.state, state):
            raise IllegalTransition(f"job {self.job.id}: {self.state} may not become {state}")

    def _enter(self, state: JobState, message: str, **fields: object) -> None:
        self.check(state)
        self.job = self.ledger.update_job(self.job.id, state=state, **fields)
        self.ledger.add_event(self.job.id, state.value, message, step=self.last_step)
        self.reporter.phase(f"{state.value.lower()}{': ' + message if message else ''}")

    # --- the named transitions -----------------------------------------------------------
    def provisioning(self, message: str) -> None:
        """Nodes are about to be launched (billing starts with the launch)."""
        self._enter(JobState.PROVISIONING, message)

    def syncing(self, message: str) -> None:
        self._enter(JobState.SYNCING, message)

    def running(self, message: str, *, started_at: datetime) -> None:
        """The run was started; `started_at` is the job's first start (max_runtime counts
        from it)."""
        self._enter(JobState.RUNNING, message, started_at=started_at)

    def recovering(self, message: str, *, recoveries: int) -> None:
        """Interrupted nodes are about to be ended and replaced (`recoveries` counts it)."""
        self._enter(JobState.RECOVERING, message, recoveries=recoveries)

    def switching(self, message: str, *, switches: int) -> None:
        """The spot policy moves the job to another market (`switches` counts it)."""
        self._enter(JobState.SWITCHING, message, switches=switches)

    def waiting(self, message: str, *, switches: int | None = None) -> None:
        """The job holds with no node (nothing billed) until the spot policy says run."""
        fields: dict[str, object] = {} if switches is None else {"switches": switches}
        self._enter(JobState.WAITING, message, **fields)

    def stopping(self, order: StopOrder) -> None:
        """The job is about to be stopped: STOPPING, with the final state it leads to, so a
        controller that adopts a half-finished stop knows how it must end. No event (the
        runner writes it apart, so a refused write keeps the two apart too)."""
        self.check(JobState.STOPPING)
        self.job = self.ledger.update_job(
            self.job.id,
            state=JobState.STOPPING,
            stop_state=order.state.value,
            exit_code=order.exit_code,
            reason=order.reason or None,
        )

    def ended(self, order: StopOrder, *, ended_at: datetime, step: int | None) -> None:
        """The job's end: every node was ended (its billing stopped) at `ended_at`."""
        self.check(order.state)
        self.job = self.ledger.update_job(
            self.job.id,
            state=order.state,
            ended_at=ended_at,
            exit_code=order.exit_code,
            reason=order.reason or None,
            step=step,
        )

    # --- what is not a state change ------------------------------------------------------
    def await_progress(self) -> None:
        """A run was just started: its first progress line gets an event."""
        self._awaiting_progress = True

    def progress(self, metrics: Metrics) -> None:
        """A progress line of rank 0: the first of a run is an event; the step (and loss) are
        written to the job at most every 2 s."""
        self.last_step = metrics.step
        self._latest = metrics
        if self._awaiting_progress:
            self._awaiting_progress = False
            self.event(
                PROGRESS_EVENT, f"first progress of this run: step {metrics.step}",
                step=metrics.step,
            )  # fmt: skip
        now = time.monotonic()
        if now - self._step_saved >= 2.0:
            fields: dict[str, object] = {"step": metrics.step}
            if metrics.loss is not None:
                fields["loss"] = metrics.loss
            self.ledger.update_job(self.job.id, **fields)
            self._step_saved = now

    def sample_progress(self) -> None:
        """Called after each watch check: the newest progress line becomes a row of the
        job's progress history when its step differs from the last row written."""
        metrics = self._latest
        if metrics is None or metrics.step == self._sampled_step:
            return
        self.ledger.add_progress_sample(
            ProgressSampleRecord(
                job_id=self.job.id,
                at=utcnow(),
                step=metrics.step,
                epoch=metrics.epoch,
                loss=metrics.loss,
                lr=metrics.lr,
                img_s=metrics.img_s,
            )  # fmt: skip
        )
        self._sampled_step = metrics.step

    def identity(self, identity: str) -> None:
        """Record the cloud identity the job's nodes are launched as."""
        self.job = self.ledger.update_job(self.job.id, identity=identity)

    def event(self, kind: str, message: str = "", *, step: int | None = None) -> None:
        self.ledger.add_event(self.job.id, kind, message, step=step)

    def leased(self, instance: Instance, *, provider: str) -> None:
        """Open the lease of a node just launched (billed from its launch time, at its launch
        price), then say so (LAUNCHED)."""
        self.ledger.open_lease(
            Lease.from_instance(
                instance, job_id=self.job.id, provider=provider, identity=self.job.identity
            )
        )
        self.ledger.add_event(
            self.job.id,
            "LAUNCHED",
            f"node {instance.rank}: {instance.instance_id} at {instance.private_ip}, "
            f"{instance.market}, ${instance.price_per_hour}/h",
        )
