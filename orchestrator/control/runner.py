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

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, KeeperOptions
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.config import Settings
from orchestrator.control.attempt import Attempt, AttemptOpener, open_attempt
from orchestrator.control.attempt import start_on_nodes as start_on_nodes
from orchestrator.control.ending import NodeEnder
from orchestrator.control.guards import Guards
from orchestrator.control.journal import Journal
from orchestrator.control.options import Reporter, RunnerOptions, SilentReporter
from orchestrator.control.ownership import check_identity
from orchestrator.control.recovery_rules import (
    Interruption,
    backoff_seconds,
    may_recover,
    salvage_seconds,
)
from orchestrator.control.stop_rules import StopOrder, runtime_order
from orchestrator.control.supervision import controller_identity
from orchestrator.control.supervisor import Decision, Supervisor, Watching
from orchestrator.control.unrecorded import UnrecordedEnd
from orchestrator.errors import (
    CapacityError,
    IdentityMismatch,
    JobCancelled,
    JobFailed,
    OrchError,
    ProviderError,
    RemoteError,
)
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.node import launch
from orchestrator.node.progress import Metrics
from orchestrator.providers.base import Instance, LaunchRequest, Provider
from orchestrator.remote.keys import ensure_identity
from orchestrator.spec.model import LoadedJob
from orchestrator.spot.driver import SWITCHED_EVENT, DeadlineDriver, PlannedMove, price_request
from orchestrator.spot.inputs import PROGRESS_EVENT, DriverState
from orchestrator.spot.policies import Decision as Market

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
    their checkpoints, `supervise` watches a started run until it hands back a decision.
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
        supervise: Callable[[Attempt], Decision] | None = None,
    ) -> None:
        self.loaded = loaded
        self.spec = loaded.spec
        self.settings = settings
        self.ledger = ledger
        self.provider = provider
        self.reporter = reporter or SilentReporter()
        self.options = options or RunnerOptions()
        self.layout = launch.NodeLayout(job.id)
        self.job_dir = settings.job_dir(job.id)
        self.keeper = keeper or CheckpointKeeper(
            job_id=job.id,
            checkpoint=self.spec.checkpoint,
            node_dir=self.layout.node_path(self.spec.checkpoint.dir),
            mirror=CheckpointMirror(self.job_dir / "checkpoints"),
            ledger=ledger,
            settings=settings,
            line=self.reporter.line,
            options=KeeperOptions(pull_every=self.spec.checkpoint.pull_every),
        )
        self.attempt = Attempt.not_launched()
        self._open_attempt = open_attempt
        self._avoid_zones: tuple[str, ...] = ()  # zones that just took nodes back
        self._last_step: int | None = None
        self._last_step_saved = 0.0
        self._awaiting_progress = False  # a run started and has not reported progress yet
        self.journal = Journal(job, ledger, self.reporter, lambda: self._last_step)
        self.guards = Guards(self.journal, self.spec, self.options, provider, self.reporter)
        self.nodes = NodeEnder(self.journal, provider, self.guards, self.reporter, settings)
        self._driver = self._deadline_driver()  # None unless the spec names a spot_policy
        self.supervisor = Supervisor(
            Watching(
                self.journal,
                self.spec,
                self.options,
                settings,
                provider,
                self.reporter,
                self.keeper,
                self.guards,
                self.layout,
                self.job_dir,
                self._driver,
            ),  # fmt: skip
            self._record_metrics,
        )
        self._supervise = supervise or self.supervisor.watch

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

        A job started as another cloud identity than the provider's raises `IdentityMismatch`
        before anything is touched: no node ended or launched, no lease closed, no state set.
        """
        self._claim_identity()
        order = StopOrder(JobState.FAILED, 1, "")
        try:
            if self.job.state == JobState.STOPPING and self.job.stop_state:
                order = StopOrder(
                    JobState(self.job.stop_state),
                    1 if self.job.exit_code is None else self.job.exit_code,
                    self.job.reason or "",
                )
                self._adopt(require_all=False)
                return self._outcome(order)
            held: StopOrder | None = None
            if self.job.state == JobState.RUNNING:
                gone = self._adopt(require_all=True)
                if gone is not None:
                    held = self.guards.ended_by_guard(gone.instance_ids)
                if gone is not None and held is None:
                    self._note_interruption(gone)
                    self._replace_nodes(gone)
                    held = self._bring_up_on_policy()
            elif self.job.state in (JobState.SWITCHING, JobState.WAITING):
                self._finish_move()
                held = self._bring_up_on_policy()
            else:
                if self.job.state != JobState.PENDING:
                    self._restart_from_scratch()
                held = self._bring_up_on_policy()
            while held is None:
                decision = self._supervise(self.attempt)
                if isinstance(decision, StopOrder):
                    held = decision
                elif isinstance(decision, PlannedMove):
                    self._move(decision)
                    held = self._bring_up_on_policy(decision.to)
                else:
                    self._salvage(decision)
                    self._replace_nodes(decision)
                    held = self._bring_up_on_policy()
            order = held
        except KeyboardInterrupt:
            order = StopOrder(JobState.CANCELLED, JobCancelled.exit_code, "cancelled")
        except OrchError as exc:
            order = StopOrder(JobState.FAILED, exc.exit_code, str(exc))
        except Exception as exc:
            order = StopOrder(JobState.FAILED, 1, f"internal error: {exc!r}")
            raise
        finally:
            with interrupts_deferred():
                self._teardown(order)
        return self._outcome(order)

    def _outcome(self, order: StopOrder) -> JobOutcome:
        return JobOutcome(self.job.id, order.state, order.exit_code, order.reason or None)

    def _end_attempt(self) -> datetime:
        """End every node of the attempt (and any other this ledger runs for the job), close
        its connections and take a fresh, not-launched attempt; returns when the provider says
        the nodes ended (their billing stopped)."""
        ended_at = self.nodes.terminate_all(self.attempt.instances)
        self.attempt.close()
        self.attempt = Attempt.not_launched()
        return ended_at

    # --- bringing a run up ------------------------------------------------------------------
    def _bring_up(self) -> None:
        """Provision, sync and start the run; nodes the cloud takes on the way are replaced
        (each time counting as a recovery)."""
        while True:
            try:
                self._provision()
                self._sync()
                self._start()
                return
            except (RemoteError, ProviderError) as exc:
                if isinstance(exc, CapacityError) or not self.attempt.instances:
                    raise
                taken = self.provider.preempted(self.attempt.ids())
                if not taken:
                    raise
                ranks = tuple(i.rank for i in self.attempt.instances if i.instance_id in taken)
                interruption = Interruption(
                    ranks, tuple(sorted(taken)), "preempted",
                    f"taken by the provider while the job started ({exc.message})", utcnow(),
                )  # fmt: skip
                self._note_interruption(interruption)
                self._replace_nodes(interruption)

    def _provision(self) -> None:
        resources = self.spec.resources
        identity = ensure_identity(self.settings.keys_dir(self.job.id), f"orch-{self.job.id}")
        self.journal.provisioning(
            f"{resources.nodes} node(s) x {resources.gpus_per_node} on {self.provider.name}"
        )
        request = LaunchRequest(
            job_id=self.job.id,
            cluster=self.job.id,
            count=resources.nodes,
            gpus_per_node=resources.gpus_per_node,
            public_key=identity.public_key,
            spot=self._driver.launch_spot if self._driver is not None else resources.spot,
            accelerator=resources.accelerator,
            max_price_per_hour=resources.max_price_per_hour,
            min_gpu_memory_gb=resources.min_gpu_memory_gb,
            disk_size_gb=resources.disk_size_gb,
            avoid_zones=self._avoid_zones,
            store=self.spec.checkpoint.store,
            guard=self.guards.terms(self._pull_wait()),
            ledger_id=self.ledger.ledger_id,
            attempt=self._launch_attempt(),
        )
        instances = self._launch(request)
        self.attempt = Attempt(instances)  # known before the leases: teardown ends them anyway
        for instance in instances:
            self.journal.leased(instance, provider=self.provider.name)
        self.attempt = self._open_attempt(instances, identity, self.options.connect_timeout)

    def _launch_attempt(self) -> int:
        """The number of the launch about to be made, 0 first: one per PROVISIONING event (each
        launch writes one first), whoever made them. So a controller that starts a job again
        after another died never repeats the idempotency tokens of that one's launch (EC2 would
        answer with the old, terminated instances, or refuse the new user data)."""
        kind = JobState.PROVISIONING.value
        return max(0, sum(1 for e in self.ledger.events(self.job.id) if e.kind == kind) - 1)

    def _launch(self, request: LaunchRequest) -> list[Instance]:
        """Launch the nodes; spot-only launches refused for capacity are retried with backoff."""
        attempt = 0
        while True:
            try:
                return self.provider.launch(request)
            except CapacityError as exc:
                if request.spot is not True or self._driver is not None:
                    raise  # a spot policy decides again instead of retrying
                if attempt >= self.options.launch_retries:
                    raise CapacityError(
                        f"spot capacity was refused {attempt + 1} time(s) in a row; last "
                        f"answer: {exc.message}",
                        hint="set resources.spot to auto (falls back on on-demand) or retry later",
                    ) from exc
                attempt += 1
                wait = backoff_seconds(attempt, self.options.launch_backoff)
                self.journal.event(
                    "WAITING", f"spot launch refused ({exc.message}); retry "
                    f"{attempt} of {self.options.launch_retries} in {wait:.0f} s",
                )  # fmt: skip
                self.reporter.phase(f"no spot capacity; retrying in {wait:.0f} s")
                time.sleep(wait)

    def _sync(self) -> None:
        self.journal.syncing(f"workdir and {len(self.spec.data)} data path(s)")
        started = time.monotonic()
        transfers = self.attempt.push(self.loaded, self.layout)
        seconds = time.monotonic() - started
        self.journal.event("SYNCED", f"{transfers} transfer(s), {seconds:.1f} s")

    def _start(self) -> None:
        attempt = self.attempt
        port = attempt.free_port()
        resume = self.keeper.prepare(attempt.cluster, **attempt.node_access())
        resume_from, resume_step = resume.path, resume.step
        instances = attempt.instances
        cluster_launch = launch.ClusterLaunch(
            job_id=self.job.id,
            run=self.spec.run,
            setup=self.spec.setup,
            num_nodes=len(instances),
            procs_per_node=self.spec.resources.gpus_per_node,
            master_addr=instances[0].private_ip,
            master_port=port,
            node_ips=[i.private_ip for i in instances],
            checkpoint_dir=self.layout.node_path(self.spec.checkpoint.dir),
            resume_from=resume_from,
            user_env=dict(self.spec.env),
        )
        self.guards.check(attempt)
        self.guards.renew(attempt)  # heard from, and the run's own deadline, before it starts
        pids = attempt.start(cluster_launch)
        self._awaiting_progress = True
        if self._driver is not None:
            self._driver.new_run()
        self.journal.running(
            f"torchrun on {len(pids)} node(s), master {cluster_launch.master_addr}:{port}",
            started_at=self.job.started_at or utcnow(),
        )
        self.guards.renew(attempt)
        if self.job.recoveries or resume_from:
            self.journal.event(
                "RESUMED", f"from {resume_from}" if resume_from else
                "from the checkpoint files pulled so far (no complete step-* directory)",
                step=resume_step,
            )  # fmt: skip

    def _record_metrics(self, metrics: Metrics, read_at: float) -> None:
        self.reporter.metrics(metrics)
        self._last_step = metrics.step
        if self._driver is not None:
            self._driver.observe(metrics, read_at)
        if self._awaiting_progress:
            self._awaiting_progress = False
            self.journal.event(
                PROGRESS_EVENT, f"first progress of this run: step {metrics.step}",
                step=metrics.step,
            )  # fmt: skip
        now = time.monotonic()
        if now - self._last_step_saved >= 2.0:
            fields: dict[str, object] = {"step": metrics.step}
            if metrics.loss is not None:
                fields["loss"] = metrics.loss
            self.ledger.update_job(self.job.id, **fields)
            self._last_step_saved = now

    # --- ownership and adoption --------------------------------------------------------------
    def _claim_identity(self) -> None:
        """Refuse a job whose nodes were launched as another cloud identity (`IdentityMismatch`,
        also written as a REFUSED event); record the provider's on a job that has none yet.

        When the cloud cannot say who this is, a job with a recorded identity is refused too
        (the error as is): nothing may be touched that cannot be seen.
        """
        recorded = [self.job.identity]
        recorded += [lease.identity for lease in self.ledger.leases(self.job.id, open_only=True)]
        try:
            current = self.provider.identity()
        except OrchError:
            if any(text is not None for text in recorded):
                raise
            return  # nothing recorded to protect: a launch says what is wrong
        try:
            check_identity(self.job.id, recorded, current)
        except IdentityMismatch as exc:
            last = self.ledger.events(self.job.id)[-1:]
            if not last or (last[0].kind, last[0].message) != ("REFUSED", str(exc)):
                self.journal.event("REFUSED", str(exc), step=self.job.step)
            raise
        if self.job.identity is None:
            self.journal.identity(current.to_json())

    def _adopt(self, *, require_all: bool) -> Interruption | None:
        """Take over the job's running nodes after a controller died; training goes on.

        With `require_all`, recorded nodes that are gone (reclaimed or lost while the job had
        no controller) come back as the interruption to recover from.
        """
        instances = self.nodes.ours(self.provider.list_owned(job_id=self.job.id))
        running = {i.instance_id for i in instances}
        missing = [
            lease
            for lease in self.ledger.leases(self.job.id, open_only=True)
            if lease.instance_id not in running
        ]
        instances = sorted(instances, key=lambda i: i.rank)
        self.attempt = Attempt(instances)
        if require_all and (missing or not instances):
            ids = tuple(lease.instance_id for lease in missing)
            taken = self.provider.preempted(list(ids)) if ids else set()
            return Interruption(
                tuple(lease.rank for lease in missing), ids,
                "preempted" if taken else "lost",
                "found gone when a new controller took the job over", utcnow(),
            )  # fmt: skip
        if not instances:
            return None
        identity = ensure_identity(self.settings.keys_dir(self.job.id), f"orch-{self.job.id}")
        self.attempt = self._open_attempt(instances, identity, self.options.connect_timeout)
        self.attempt.started = True
        self._last_step = self.job.step
        try:
            self.keeper.adopt(self.attempt.cluster, **self.attempt.node_access())
        except OrchError as exc:
            self.journal.event("WARNING", f"checkpoint agents: {exc}")
        self.journal.event(
            "ADOPTED", f"controller {controller_identity()} took over "
            f"{len(instances)} node(s)", step=self.job.step,
        )  # fmt: skip
        self.reporter.phase(f"adopted by controller {controller_identity()}")
        return None

    # --- recovery -------------------------------------------------------------------------------
    def _salvage(self, interruption: Interruption) -> None:
        """Keep what the interrupted run can still give before its nodes go.

        After a notice the nodes still run: every trainer gets SIGTERM (rank 0 writes its
        emergency checkpoint), and what the agents stage of it is collected before the reclaim.
        Without a notice, what the nodes that still answer hold is collected: a checkpoint
        that needed a lost node's files is whole only if those arrived before it was lost.
        """
        self._note_interruption(interruption)
        started = time.monotonic()
        grace = salvage_seconds(interruption, utcnow(), self.options.stop_grace)
        if grace > 0:
            self.attempt.stop_trainers(self.layout, grace)
        skip = self._unanswering(interruption)
        if len(skip) < len(self.attempt.instances):
            wait = salvage_seconds(interruption, utcnow(), self.options.final_pull_wait)
            try:
                self.keeper.finish(skip=skip, wait_s=wait if interruption.cause == "notice" else 0)
            except OrchError as exc:
                self.journal.event("WARNING", f"salvage pull failed: {exc}")
        if interruption.cause == "notice" and self.attempt.watch is not None:
            with contextlib.suppress(OrchError):
                self.attempt.watch.catch_up()
        newest = self.keeper.newest()
        self.journal.event(
            "SALVAGED", f"newest checkpoint {newest.name if newest else 'none'}, "
            f"{time.monotonic() - started:.1f} s after detection",
            step=newest.step if newest else None,
        )  # fmt: skip

    def _unanswering(self, interruption: Interruption) -> set[int]:
        """Nodes not to ask for checkpoints after an interruption: those lost or taken, and
        those that missed the last probe or that the provider reports taken meanwhile (asking
        them would cost a connection timeout). After a notice every node still runs."""
        attempt = self.attempt
        if interruption.cause == "notice" or not attempt.instances:
            return set()
        skip = set(interruption.ranks) | set(attempt.gone_ranks)
        if attempt.watch is not None:
            skip |= {rank for rank, misses in enumerate(attempt.watch.misses) if misses}
        rest = [i for i in attempt.instances if i.rank not in skip]
        taken = self.provider.preempted([i.instance_id for i in rest]) if rest else set()
        return skip | {i.rank for i in rest if i.instance_id in taken}

    def _note_interruption(self, interruption: Interruption) -> None:
        self.journal.event(
            "PREEMPTED", f"{interruption.cause}: {interruption.describe()}", step=self._last_step
        )
        self.reporter.phase(f"interrupted: {interruption.describe()}")

    def _replace_nodes(self, interruption: Interruption) -> None:
        """End every node of the interrupted run, so `_bring_up` can start over on new ones.

        Raises `JobFailed` (nothing is replaced) once `recovery.max_recoveries` are used up.
        """
        limit = self.spec.recovery.max_recoveries
        done = self.job.recoveries
        if not may_recover(done, limit):
            raise JobFailed(
                f"{interruption.cause}: {interruption.describe()}; no recovery left "
                f"(recovery.max_recoveries is {limit}, {done} used)",
                hint="raise recovery.max_recoveries, or run on on-demand nodes (--no-spot); the "
                "newest checkpoint is in the job's directory",
            )
        instances = self.attempt.instances
        self.journal.recovering(
            f"recovery {done + 1} of {limit}: replacing {len(instances) or 'the'} node(s)",
            recoveries=done + 1,
        )
        taken = set(interruption.instance_ids)
        self._avoid_zones = tuple({i.zone for i in instances if i.instance_id in taken} - {None})
        self._end_attempt()

    def _restart_from_scratch(self) -> None:
        """The controller died before training started: end what it launched, start over."""
        self.journal.event(
            "RESTARTED", f"found {self.job.state} without a controller; its nodes are replaced"
        )
        self._end_attempt()

    # --- the spot policy (spec.spot_policy; see orchestrator.spot.driver) ---------------
    def _deadline_driver(self) -> DeadlineDriver | None:
        if self.spec.spot_policy is None:
            return None
        return DeadlineDriver(
            job_id=self.job.id,
            spec=self.spec,
            submitted_at=self.job.created_at,
            ledger=self.ledger,
            provider=self.provider,
            launch_request=price_request(self.job.id, self.spec),
            interval_s=self.options.policy_interval,
            overhead_prior_s=self.options.restart_overhead_prior,
            state=DriverState.from_json(self.job.policy_state),
        )

    def _bring_up_on_policy(self, first: Market | None = None) -> StopOrder | None:
        """`_bring_up` on the market the spot policy picks (`first`, or a fresh decision);
        without a policy, plain `_bring_up`.

        While the policy says wait, the job holds with no node (WAITING); a spot launch refused
        for capacity makes the policy decide again, seeing no spot. Returns the order to end
        the job when one comes while it waits (max_runtime), else None once the run started.
        """
        driver = self._driver
        if driver is None:
            self._bring_up()
            return None
        decision = first or driver.decide_idle(self._resume_step())
        while True:
            if decision is Market.WAIT:
                order = self._hold(driver)
                if order is not None:
                    return order
                decision = driver.market or Market.ON_DEMAND
            driver.commit(decision)
            try:
                self._bring_up()
                return None
            except CapacityError:
                if decision is not Market.SPOT:
                    raise
                driver.spot_refused()
                decision = driver.decide_idle(self._resume_step())

    def _hold(self, driver: DeadlineDriver) -> StopOrder | None:
        """Wait with no node (nothing billed) until the policy says run; None then."""
        if self.job.state != JobState.WAITING:
            self.journal.waiting(f"{driver.policy.name}: no node until it says run")
        while True:
            started = self.job.started_at
            order = (
                runtime_order(
                    elapsed_s=(utcnow() - started).total_seconds(),
                    max_runtime_s=self.spec.budget.max_runtime,
                )
                if started is not None
                else None
            )
            if order is not None:
                return order
            time.sleep(self.options.policy_interval)
            if driver.decide_idle(self._resume_step()) is not Market.WAIT:
                return None

    def _move(self, move: PlannedMove) -> None:
        """Carry out a planned move of the spot policy; not a recovery (`switches` counts it).

        Intent first: the policy's new market, then SWITCHING (or WAITING) are written; then
        the trainers get SIGTERM and checkpoint, the checkpoint is pulled and the nodes ended.
        """
        assert self._driver is not None  # only a spot policy plans moves
        self._driver.commit(move.to)
        switches = self.job.switches + 1
        message = f"switch {switches}: {move.describe()}"
        if move.to is Market.WAIT:
            self.journal.waiting(message, switches=switches)
        else:
            self.journal.switching(message, switches=switches)
        started = time.monotonic()
        self._end_nodes()
        newest = self.keeper.newest()
        self.journal.event(
            SWITCHED_EVENT, f"{move.source.value} -> {move.to.value}: nodes ended "
            f"{time.monotonic() - started:.1f} s after the decision, newest checkpoint "
            f"{newest.name if newest else 'none'}",
            step=newest.step if newest else None,
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
                self._final_pull()
            except OrchError as exc:
                self.journal.event("WARNING", f"pull before the move: {exc}")
            if attempt.watch is not None:
                with contextlib.suppress(OrchError):
                    attempt.watch.catch_up()
        self._end_attempt()

    def _resume_step(self) -> int | None:
        """The step a start now would resume from."""
        newest = self.keeper.newest()
        if newest is not None and newest.step is not None:
            return newest.step
        return self._last_step if self._last_step is not None else self.job.step

    # --- checkpoints, logs and teardown ------------------------------------------------------
    def _pull_wait(self) -> float:
        """How long the nodes' agents may take to stage what a run left (longer when the
        store holds the only copy)."""
        if self.spec.checkpoint.mirror_mode == "none":
            return self.options.store_only_wait
        return self.options.final_pull_wait

    def _final_pull(self) -> None:
        """Collect what the run left, once the nodes' agents staged it (bounded wait)."""
        self.keeper.finish(skip=self.attempt.gone_ranks, wait_s=self._pull_wait())

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
        writes, journal = self.nodes.writes, self.journal
        writes.write("the job's stop (STOPPING)", lambda: journal.stopping(order))
        writes.write(
            "the STOPPING event",
            lambda: journal.event(
                "STOPPING", f"{order.state.value}: {reason or 'finished'}", step=self._last_step
            ),
        )
        self.reporter.phase(
            f"stopping ({order.state.value}): pulling checkpoints and logs, shutting nodes down"
        )
        if self.attempt.running:
            if order.state is not JobState.SUCCEEDED:
                self.attempt.stop_trainers(self.layout, self.options.stop_grace)
            for salvage in (self._final_pull, self._catch_up_logs):
                try:
                    salvage()
                except Exception as exc:  # noqa: BLE001 - nothing may keep the nodes from ending
                    self.nodes.warn(f"during teardown: {exc}")
        ended_at = self._end_attempt()
        try:
            self.keeper.sweep_store()
        except Exception as exc:  # noqa: BLE001 - the job's end is recorded whatever happens here
            self.nodes.warn(f"store cleanup: {exc}")
        step = self._last_step if self._last_step is not None else self.job.step
        writes.write(
            f"the job's end ({order.state.value})",
            lambda: journal.ended(order, ended_at=ended_at, step=step),
        )
        writes.write(
            f"the {order.state.value} event",
            lambda: journal.event(order.state.value, reason or "", step=self._last_step),
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
