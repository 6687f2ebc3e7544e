"""The job state machine: provision, sync, start, watch, recover or move, tear down.

`JobRunner.run()` drives one job in the foreground and always ends in a final state with every
node terminated: teardown sits in a `finally` that no error path skips, and Ctrl-C during
teardown is held back until the nodes are gone. Every state change is written to the ledger
(`Journal`) before the action it announces, so a killed controller leaves a trail to
reconcile from. The nodes of the current launch are the runner's `Attempt`; watching a run is
the `Supervisor`'s, which hands back one decision.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.cluster.checkpoints.kept_summary import kept_phrase
from orchestrator.config import Settings
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.attempt import Attempt, AttemptOpener, open_attempt
from orchestrator.control.run.attempt import start_on_nodes as start_on_nodes
from orchestrator.control.run.bring_up import BringUp
from orchestrator.control.run.current_attempt import CurrentAttempt
from orchestrator.control.run.data_step import PhaseStopped
from orchestrator.control.run.early_replacement import split_duplicate_ranks
from orchestrator.control.run.ending import NodeEnder
from orchestrator.control.run.kept_nodes import KeptNodes
from orchestrator.control.run.kept_turn import setup_digest
from orchestrator.control.run.launcher import Launcher
from orchestrator.control.run.options import Reporter, RunnerOptions, SilentReporter
from orchestrator.control.run.parts import job_parts
from orchestrator.control.run.recovering import Recovery
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.restarting import SameNodeRestarts
from orchestrator.control.run.salvage import Salvage
from orchestrator.control.run.start_rules import FailedStart
from orchestrator.control.run.unrecorded import UnrecordedEnd
from orchestrator.control.run.watching import Supervisor, Verdict
from orchestrator.errors import (
    JobCancelled,
    JobFailed,
    OrchError,
)
from orchestrator.job_state import JobState
from orchestrator.ledger.fencing import LeaseLost
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.node.progress import Metrics
from orchestrator.providers.base import Provider
from orchestrator.spec.model import LoadedJob
from orchestrator.spot.driver import SWITCHED_EVENT, DeadlineDriver, PlannedMove
from orchestrator.spot.policies import (
    Decision as Market,
)  # the policy picks SPOT, ON_DEMAND or WAIT

__all__ = [
    "JobOutcome",
    "JobRunner",
    "Reporter",
    "RunnerOptions",
    "SilentReporter",
    "interrupts_deferred",
    "start_on_nodes",
]


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    state: JobState
    exit_code: int
    reason: str | None


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back (main thread only) so teardown cannot be cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class JobRunner:
    """Drives one job to a final state, in a foreground submit or a detached controller.

    Build it (no I/O), then call `run()` once, holding the job's controller lock. The seams
    default to the real thing: `open_attempt` connects to launched nodes, `keeper` collects
    their checkpoints, `supervise` watches a started run until it hands back its verdict,
    `driver` is the spot policy the spec names (None without one).
    """

    def __init__(
        self,
        job: Job,
        loaded: LoadedJob,
        *,
        settings: Settings,
        ledger: Ledger,
        provider: Provider,
        reporter: Reporter | None = None,
        options: RunnerOptions | None = None,
        open_attempt: AttemptOpener = open_attempt,
        keeper: CheckpointKeeper | None = None,
        supervise: Callable[[Attempt], Verdict] | None = None,
        driver: DeadlineDriver | None = None,
    ) -> None:
        self.loaded = loaded
        self.spec = loaded.spec
        self.settings = settings
        self.ledger = ledger
        self.provider = provider
        self.reporter = reporter or SilentReporter()
        self.options = options or RunnerOptions()
        parts = job_parts(
            job, loaded, settings=settings, ledger=ledger, provider=provider,
            reporter=self.reporter, options=self.options, keeper=keeper, driver=driver,
        )  # fmt: skip
        self.journal, self.keeper, self.guards = parts.journal, parts.keeper, parts.guards
        self.layout, self._driver = parts.layout, parts.driver
        self.nodes = NodeEnder(self.journal, provider, self.guards, self.reporter, settings)
        self.current = current = CurrentAttempt(self.nodes)
        self.launcher = Launcher(
            journal=self.journal, loaded=loaded, layout=self.layout, settings=settings,
            options=self.options, provider=provider, reporter=self.reporter, keeper=self.keeper,
            guards=self.guards, driver=self._driver, open_attempt=open_attempt, current=current,
        )  # fmt: skip
        self.supervisor = Supervisor(
            journal=self.journal, spec=self.spec, layout=self.layout,
            logs_dir=parts.job_dir / "logs", settings=settings, options=self.options,
            provider=provider, reporter=self.reporter, keeper=self.keeper, guards=self.guards,
            driver=self._driver, team=parts.team, on_metrics=self._record_metrics,
        )  # fmt: skip
        self.salvage = Salvage(
            keeper=self.keeper, journal=self.journal, reporter=self.reporter, provider=provider,
            layout=self.layout, options=self.options,
            store_only=self.spec.checkpoint.mirror_mode == "none",
            upload_outputs=lambda attempt, ranks, timeout_s: self.launcher.data.upload_outputs(
                attempt, ranks=ranks, why="spot notice", timeout_s=timeout_s
            ),
        )  # fmt: skip
        self.restarts = SameNodeRestarts(self.journal, self.layout, self.launcher)
        self._supervise = supervise or self.supervisor.watch
        self.kept: KeptNodes | None = None
        if job.cluster_id is not None:
            self.kept = KeptNodes(
                journal=self.journal, loaded=loaded, layout=self.layout, settings=settings,
                provider=provider, reporter=self.reporter, guards=self.guards,
                launcher=self.launcher, current=current, nodes=self.nodes,
            )  # fmt: skip
        else:  # a survivor of a lost peer skips the setup it already ran
            self.launcher.setup_key = setup_digest(loaded.spec.setup, loaded.workdir)
        self.recovery = Recovery(
            spec=self.spec, journal=self.journal, reporter=self.reporter, provider=provider,
            current=current, launcher=self.launcher, salvage=self.salvage, nodes=self.nodes,
            keeper=self.keeper, layout=self.layout, driver=self._driver,
            kept=self.kept is not None,
        )  # fmt: skip
        self.bring_up = BringUp(
            spec=self.spec, journal=self.journal, options=self.options, provider=provider,
            current=current, launcher=self.launcher, recovery=self.recovery,
            salvage=self.salvage, keeper=self.keeper, kept=self.kept, driver=self._driver,
        )  # fmt: skip

    @property
    def attempt(self) -> Attempt:
        """The nodes of the current launch (`current`)."""
        return self.current.attempt

    @property
    def job(self) -> Job:
        """The job's row as this runner last wrote it."""
        return self.journal.job

    # --- the whole run ----------------------------------------------------------------------
    def run(self) -> JobOutcome:
        """Drive the job from its recorded state to a final one; always tears down.

        PENDING starts from scratch. A job found RUNNING is adopted (its training never
        stopped; nodes lost meanwhile are replaced); one found PROVISIONING, SYNCING or
        RECOVERING is started again on fresh nodes, from its newest pulled checkpoint; one
        found STOPPING finishes its stop. Interrupted nodes (spot notice, reclaim, loss) are
        replaced and the run resumed, at most `recovery.max_recoveries` times. With a
        `spot_policy`, the policy picks the market of every launch and may move the job (or
        make it wait) while it runs; one found SWITCHING or WAITING finishes that move first.
        A start that makes no progress within `recovery.start_timeout` is restarted once on
        the same nodes, then fails the job (`restarting`).

        A job started as another cloud identity than the provider's raises `IdentityMismatch`
        before anything is touched: no node ended or launched, no lease closed, no state set.
        On a fenced ledger (`ledger.fencing`), a write or a terminate that finds the
        controller lease another's raises `LeaseLost` with no teardown: the job and its nodes
        are left as they are, to the lease's holder.
        """
        self.launcher.claim_identity()
        try:
            return self._run()
        finally:
            if self.kept is not None:
                self.kept.turn.release()

    def _run(self) -> JobOutcome:
        order = StopOrder(JobState.FAILED, 1, "")
        lost = False
        try:
            if self.kept is not None:
                self.kept.take_turn()
            if self.job.state == JobState.STOPPING and self.job.stop_state:
                order = StopOrder(
                    JobState(self.job.stop_state),
                    1 if self.job.exit_code is None else self.job.exit_code,
                    self.job.reason or "",
                )
                self._adopt(require_all=False)
                return self._outcome(order)
            held: StopOrder | None = None
            recovery = self.recovery
            if self.job.state == JobState.RUNNING:
                gone = self._adopt(require_all=True)
                if gone is not None:
                    held = self.guards.ended_by_guard(gone.instance_ids)
                if gone is not None and held is None:
                    recovery.note(gone)
                    if self.attempt.connected:  # the ranks that run stay: keep what they hold
                        self.salvage.adopted(self.attempt, gone)
                    held = self.bring_up.on_policy(recovery.recover(gone))
            elif self.job.state in (JobState.SWITCHING, JobState.WAITING):
                self._finish_move()
                held = self.bring_up.on_policy(recovery.fresh())
            else:
                plan = recovery.fresh()
                if self.job.state != JobState.PENDING:
                    plan = recovery.restart_from_scratch()
                held = self.bring_up.on_policy(plan)
            while held is None:
                try:
                    verdict = self._supervise(self.attempt)
                except JobFailed as failure:
                    restart = recovery.fall_back(failure)
                    if restart is None:
                        raise
                    held = self.bring_up.on_policy(restart)
                    continue
                if isinstance(verdict, FailedStart):
                    held = self.restarts.restart(self.attempt, verdict)
                    continue
                self.restarts.other_decision()
                if isinstance(verdict, StopOrder):
                    held = verdict
                elif isinstance(verdict, PlannedMove):
                    self._move(verdict)
                    held = self.bring_up.on_policy(recovery.fresh(), verdict.to)
                else:
                    early = recovery.launch_early(verdict)
                    recovery.note(verdict)
                    self.salvage.interrupted(self.attempt, verdict)
                    held = self.bring_up.on_policy(recovery.recover(verdict, early))
            order = held
        except LeaseLost:
            lost = True  # another controller drives the job now: nothing more from here
            raise
        except KeyboardInterrupt:
            order = StopOrder(JobState.CANCELLED, JobCancelled.exit_code, "cancelled")
        except PhaseStopped as exc:  # a cap reached while the data moved
            order = exc.order
        except OrchError as exc:
            order = StopOrder(JobState.FAILED, exc.exit_code, str(exc))
        except Exception as exc:
            order = StopOrder(JobState.FAILED, 1, f"internal error: {exc!r}")
            raise
        finally:
            if not lost:
                with interrupts_deferred():
                    self._teardown(order)
        return self._outcome(order)

    def _end_or_keep(self, order: StopOrder) -> datetime:
        """At the job's end: a kept cluster whose nodes are all up is let go, still running
        (its nodes bill to the cluster from now); every other node ends."""
        kept = self.kept
        if kept is None or not kept.held:
            return self.current.end()
        if kept.may_keep(self.attempt):
            released_at = kept.release(self.attempt)
            self.current.let_go()
            return released_at
        ended_at = self.current.end()
        kept.ended(ended_at, f"its nodes ended with job {self.job.id} ({order.state.value})")
        return ended_at

    def _outcome(self, order: StopOrder) -> JobOutcome:
        return JobOutcome(self.job.id, order.state, order.exit_code, order.reason or None)

    def _record_metrics(self, metrics: Metrics, read_at: float) -> None:
        self.reporter.metrics(metrics)
        if self._driver is not None:
            self._driver.observe(metrics, read_at)
        self.journal.progress(metrics)

    # --- ownership and adoption --------------------------------------------------------------
    def _adopt(self, *, require_all: bool) -> Interruption | None:
        """Take over the job's running nodes after a controller died; training goes on.

        With `require_all`, recorded nodes that are gone (reclaimed or lost while the job had
        no controller) come back as the interruption to recover from.
        """
        self._take_up_progress()
        instances = self.nodes.ours(self.provider.list_owned(job_id=self.job.node_owner))
        instances, early = split_duplicate_ranks(instances)
        if early:  # replacements launched at a notice by a controller that died since
            ids = [i.instance_id for i in early]
            self.journal.event("WARNING", f"ending {', '.join(ids)}: launched early for a "
                               "rank whose node still runs")  # fmt: skip
            self.nodes.terminate_these(ids, known=early)
        running = {i.instance_id for i in instances}
        missing = [
            lease
            for lease in self.ledger.leases(self.job.id, open_only=True)
            if lease.instance_id not in running
        ]
        instances = sorted(instances, key=lambda i: i.rank)
        self.current.hold(Attempt(instances))
        if self.kept is not None:
            self.kept.adopted()
        # A rank with neither a node nor a lease: the job was rebuilt from its nodes after its
        # ledger died (`control.repair.rebuild`), and that rank's node had ended before.
        held = {i.rank for i in instances} | {lease.rank for lease in missing}
        absent = [rank for rank in range(self.spec.resources.nodes) if rank not in held]
        if require_all and (missing or absent or not instances):
            if instances and not missing:
                # Only ranks without a node: connect to those that run, so that they may stay
                # (with their checkpoint files) while the absent ranks are replaced.
                self.current.hold(self.launcher.adopt(instances))
            ids = tuple(lease.instance_id for lease in missing)
            taken = self.provider.preempted(list(ids)) if ids else set()
            return Interruption(
                (*(lease.rank for lease in missing), *absent), ids,
                "preempted" if taken else "lost",
                "found gone when a new controller took the job over", utcnow(),
            )  # fmt: skip
        if not instances:
            return None
        self.current.hold(self.launcher.adopt(instances))
        return None

    def _take_up_progress(self) -> None:
        """Take up the job's progress as the controller that died left it: the ledger's step,
        or a newer one in the log copy of rank 0's newest node. That controller may have read
        steps it had not yet written (a job's step is written every 2 s), whether the run goes
        on, ended, or its nodes are ended already (a stop half done); a new watch goes on
        after the copied lines and never reads them again."""
        self.journal.last_step = self.job.step
        rank0 = [lease for lease in self.ledger.leases(self.job.id) if lease.rank == 0]
        if not rank0:
            return
        newest = max(rank0, key=lambda lease: lease.launched_at)
        copied = self.supervisor.copied_progress(newest.instance_id)
        known = self.journal.last_step
        if copied is not None and (known is None or copied.step > known):
            self.journal.progress(copied)

    # --- planned moves of the spot policy (spec.spot_policy; see orchestrator.spot.driver) --
    def _move(self, move: PlannedMove) -> None:
        """Carry out a planned move of the spot policy; not a recovery (`switches` counts it).

        Intent first: the policy's new market, then SWITCHING (or WAITING) are written; then
        the trainers get SIGTERM and checkpoint, the checkpoint is pulled and the nodes ended.
        """
        assert self._driver is not None  # only a spot policy plans moves
        self._driver.commit(move.to, move.zone)
        switches = self.job.switches + 1
        message = f"switch {switches}: {move.describe()}"
        if move.to is Market.WAIT:
            self.journal.waiting(message, switches=switches)
        else:
            self.journal.switching(message, switches=switches)
        started = time.monotonic()
        self._end_nodes()
        kept = self.keeper.kept()
        self.journal.event(
            SWITCHED_EVENT, f"{move.source.value} -> {move.to.value}: nodes ended "
            f"{time.monotonic() - started:.1f} s after the decision, "
            f"{kept_phrase(kept, utcnow())}",
            step=kept[0].step if kept else None,
        )  # fmt: skip

    def _finish_move(self) -> None:
        """A controller died during a planned move (or a wait): end what is left of the run,
        its checkpoint pulled first."""
        self._adopt(require_all=False)
        self._end_nodes()

    def _end_nodes(self) -> None:
        """Stop the run (SIGTERM: the trainers checkpoint), pull, and end every node."""
        attempt = self.attempt
        if attempt.running:
            attempt.stop_trainers(self.layout, self.options.stop_grace)
            try:
                self.salvage.final_pull(self.attempt)
            except OrchError as exc:
                self.journal.event("WARNING", f"pull before the move: {exc}")
            if attempt.watch is not None:
                with contextlib.suppress(OrchError):
                    attempt.watch.catch_up()
        self.current.end()

    # --- checkpoints, logs and teardown ------------------------------------------------------
    def _catch_up_logs(self) -> None:
        attempt = self.attempt
        if attempt.watch is None:
            attempt.watch = self.supervisor.run_watch(attempt)
        attempt.watch.catch_up(skip=attempt.gone_ranks)

    def _teardown(self, order: StopOrder) -> None:
        """Salvage what can be salvaged, then end every node of the job and close its leases.

        The final state is written first (as `stop_state`, with the job STOPPING), so a
        controller that adopts a half-finished stop knows how the job must end. Every ledger
        write here is best effort (`DeferredWrites`): a ledger that refuses writes never keeps
        the nodes from ending; what it refused is tried once more after the termination, and
        what it still refuses is saved under ORCH_HOME/unrecorded/ for `orch reconcile`.
        """
        reason = order.reason or None
        try:
            self.recovery.end_early()
        except Exception as exc:  # noqa: BLE001 - nothing may keep the nodes from ending
            self.nodes.warn(f"during teardown: {exc}")
        writes, journal = self.nodes.writes, self.journal
        writes.write("the job's stop (STOPPING)", lambda: journal.stopping(order))
        writes.write(
            "the STOPPING event",
            lambda: journal.event(
                "STOPPING",
                f"{order.state.value}: {reason or 'finished'}",
                step=self.journal.last_step,
            ),
        )
        ending = "keeping the cluster's nodes" if self.kept is not None else "shutting nodes down"
        self.reporter.phase(
            f"stopping ({order.state.value}): pulling checkpoints and logs, {ending}"
        )
        if self.attempt.running:
            if order.state is not JobState.SUCCEEDED:
                self.attempt.stop_trainers(self.layout, self.options.stop_grace)
            for salvage in (
                lambda: self.salvage.final_pull(self.attempt),
                self._catch_up_logs,
                lambda: self.launcher.data.upload_outputs(
                    self.attempt, ranks=None, why=f"job {order.state.value.lower()}"
                ),
            ):
                try:
                    salvage()
                except Exception as exc:  # noqa: BLE001 - nothing may keep the nodes from ending
                    self.nodes.warn(f"during teardown: {exc}")
        ended_at = self._end_or_keep(order)
        try:
            self.keeper.sweep_store()
        except Exception as exc:  # noqa: BLE001 - the job's end is recorded whatever happens here
            self.nodes.warn(f"store cleanup: {exc}")
        step = self.journal.last_step if self.journal.last_step is not None else self.job.step
        writes.write(
            f"the job's end ({order.state.value})",
            lambda: journal.ended(order, ended_at=ended_at, step=step),
        )
        writes.write(
            f"the {order.state.value} event",
            lambda: journal.event(order.state.value, reason or "", step=self.journal.last_step),
        )
        if writes.retry():
            self.nodes.save_unrecorded(
                UnrecordedEnd(
                    self.job.id,
                    list(self.nodes.unclosed),
                    order.state,
                    order.exit_code,
                    reason,
                    step,
                    ended_at,
                )  # fmt: skip
            )
        self.reporter.phase(order.state.value.lower())
