"""The job state machine: provision, sync, start, watch, pull checkpoints, tear down.

`JobRunner.run()` drives one job in the foreground and always ends in a final state with every
node terminated: teardown sits in a `finally` that no error path skips, and Ctrl-C during
teardown is held back until the nodes are gone. Every state change is written to the ledger
before the action it announces, so a killed controller leaves a trail to reconcile from.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from orchestrator.cluster.activity import ActivityThresholds, JobActivity
from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, KeeperOptions
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.notice_watch import NoticeWatcher
from orchestrator.cluster.run_watch import RunWatch
from orchestrator.config import Settings
from orchestrator.control.ownership import check_identity, partition
from orchestrator.control.reconcile import lease_unrecorded
from orchestrator.control.recovery_rules import (
    Interruption,
    backoff_seconds,
    may_recover,
    salvage_seconds,
)
from orchestrator.control.stop_rules import (
    StopOrder,
    budget_order,
    guard_limit_at,
    idle_order,
    runtime_order,
)
from orchestrator.control.supervision import controller_identity
from orchestrator.control.unrecorded import (
    LEDGER_FAILURES,
    DeferredWrites,
    UnrecordedEnd,
    save_unrecorded,
)
from orchestrator.errors import (
    CapacityError,
    IdentityMismatch,
    InstancesNotFound,
    JobCancelled,
    JobFailed,
    NodeLost,
    OrchError,
    ProviderError,
    RemoteError,
)
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Lease, Ledger, hourly_rate, total_cost, utcnow
from orchestrator.node import launch
from orchestrator.node.guard_protocol import (
    GuardLayout,
    GuardTerms,
    lease_document,
    lease_until,
    parse_status,
    renew_command,
    status_command,
)
from orchestrator.node.progress import Metrics
from orchestrator.node.spot_notice import SpotNotice
from orchestrator.providers.base import Instance, LaunchRequest, NodeEnd, Provider
from orchestrator.remote.keys import ensure_identity
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import Transfer, push_argv, run_parallel
from orchestrator.spec.model import LoadedJob
from orchestrator.spot.driver import (
    SWITCHED_EVENT,
    DeadlineDriver,
    PlannedMove,
    price_request,
)
from orchestrator.spot.inputs import PROGRESS_EVENT, DriverState
from orchestrator.spot.policies import Decision


class Reporter(Protocol):
    """Where the runner tells a human what happens. Implementations must not raise."""

    def phase(self, text: str) -> None: ...

    def metrics(self, metrics: Metrics) -> None: ...

    def line(self, text: str) -> None: ...


class SilentReporter:
    def phase(self, text: str) -> None:
        pass

    def metrics(self, metrics: Metrics) -> None:
        pass

    def line(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class RunnerOptions:
    """Timing knobs of the runner (seconds)."""

    watch_interval: float = 5.0  # how often nodes are probed (liveness, logs, GPUs)
    budget_interval: float = 10.0  # how often spend is checked against the caps
    stop_allowance: float = 15.0  # seconds a budget stop may take (SIGTERM, pull, terminate)
    lost_after: int = 3  # consecutive failed probes before a node counts as lost
    probe_timeout: float = 5.0  # a node unanswered this long (or a watch interval) missed a check
    stop_grace: float = 60.0  # how long trainers get to checkpoint after SIGTERM
    connect_timeout: float = 10.0
    idle_util_pct: float = 5.0  # GPU utilization below which a GPU is idle
    idle_cpu_pct: float = 10.0  # without GPUs: job CPU (% of one core) below which it is idle
    gpu_sample_every: float = 30.0  # the ledger keeps one averaged GPU sample per window
    notice_poll_interval: float = 5.0  # how often each node polls for a spot notice
    deadman_timeout: float = 600.0  # a node unheard from this long, not training, ends itself
    final_pull_wait: float = 60.0  # at a run's end, how long the nodes' agents may take to stage
    store_only_wait: float = 900.0  # the same with `mirror: none`: the store has the only copy
    launch_retries: int = 5  # refused spot-only launches retried before the job fails
    launch_backoff: float = 10.0  # first wait before such a retry; doubles each time
    policy_interval: float = 5.0  # spot policy (spec.spot_policy): seconds between decisions
    restart_overhead_prior: float = 720.0  # spot policy: a restart's cost until one is measured


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

    Build it (no I/O), then call `run()` once, holding the job's controller lock.
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
    ) -> None:
        self.job = job
        self.loaded = loaded
        self.spec = loaded.spec
        self.settings = settings
        self.ledger = ledger
        self.provider = provider
        self.reporter = reporter or SilentReporter()
        self.options = options or RunnerOptions()
        self.layout = launch.NodeLayout(job.id)
        self.job_dir = settings.job_dir(job.id)
        self.mirror = CheckpointMirror(self.job_dir / "checkpoints")
        self.keeper = CheckpointKeeper(
            job_id=job.id,
            checkpoint=self.spec.checkpoint,
            node_dir=self.layout.node_path(self.spec.checkpoint.dir),
            mirror=self.mirror,
            ledger=ledger,
            settings=settings,
            line=self.reporter.line,
            options=KeeperOptions(pull_every=self.spec.checkpoint.pull_every),
        )
        self.cluster: Cluster | None = None
        self.instances: list[Instance] = []
        self._started = False
        self._watch: RunWatch | None = None
        self._gone_ranks: set[int] = set()  # nodes of the cluster found lost, reclaimed or downed
        self._avoid_zones: tuple[str, ...] = ()  # zones that just took nodes back
        self._last_step: int | None = None
        self._last_step_saved = 0.0
        self._driver = self._deadline_driver()  # None unless the spec names a spot_policy
        self._awaiting_progress = False  # a run started and has not reported progress yet
        self._writes = DeferredWrites(self.reporter.line)  # teardown's best-effort writes
        self._unclosed: list[tuple[list[str], datetime]] = []  # ended, lease end not written

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
                    held = self._ended_by_guard(gone.instance_ids)
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
                outcome = self._supervise()
                if isinstance(outcome, StopOrder):
                    held = outcome
                elif isinstance(outcome, PlannedMove):
                    self._move(outcome)
                    held = self._bring_up_on_policy(outcome.to)
                else:
                    self._salvage(outcome)
                    self._replace_nodes(outcome)
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

    # --- phases -------------------------------------------------------------------------------
    def _set_state(self, state: JobState, message: str = "", **fields: object) -> None:
        self.job = self.ledger.update_job(self.job.id, state=state, **fields)
        self.ledger.add_event(self.job.id, state.value, message, step=self._last_step)
        self.reporter.phase(f"{state.value.lower()}{': ' + message if message else ''}")

    def _provision(self) -> None:
        resources = self.spec.resources
        identity = ensure_identity(self.settings.keys_dir(self.job.id), f"orch-{self.job.id}")
        self._set_state(
            JobState.PROVISIONING,
            f"{resources.nodes} node(s) x {resources.gpus_per_node} on {self.provider.name}",
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
            guard=self._guard_terms(),
            ledger_id=self.ledger.ledger_id,
            attempt=self._launch_attempt(),
        )
        self.instances = self._launch(request)
        for instance in self.instances:
            self.ledger.open_lease(
                Lease.from_instance(
                    instance,
                    job_id=self.job.id,
                    provider=self.provider.name,
                    identity=self.job.identity,
                )
            )
            self.ledger.add_event(
                self.job.id,
                "LAUNCHED",
                f"node {instance.rank}: {instance.instance_id} at {instance.private_ip}, "
                f"{instance.market}, ${instance.price_per_hour}/h",
            )
        self.cluster = Cluster(
            self.instances, identity, connect_timeout=self.options.connect_timeout
        )

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
                self.ledger.add_event(
                    self.job.id, "WAITING", f"spot launch refused ({exc.message}); retry "
                    f"{attempt} of {self.options.launch_retries} in {wait:.0f} s",
                )  # fmt: skip
                self.reporter.phase(f"no spot capacity; retrying in {wait:.0f} s")
                time.sleep(wait)

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
                if isinstance(exc, CapacityError) or not self.instances:
                    raise
                taken = self.provider.preempted([i.instance_id for i in self.instances])
                if not taken:
                    raise
                ranks = tuple(i.rank for i in self.instances if i.instance_id in taken)
                interruption = Interruption(
                    ranks, tuple(sorted(taken)), "preempted",
                    f"taken by the provider while the job started ({exc.message})", utcnow(),
                )  # fmt: skip
                self._note_interruption(interruption)
                self._replace_nodes(interruption)

    def _sync(self) -> None:
        assert self.cluster is not None
        self._set_state(JobState.SYNCING, f"workdir and {len(self.spec.data)} data path(s)")
        started = time.monotonic()
        transfers: list[Transfer] = []
        for address in self.cluster.addresses:
            transfers.append(
                Transfer(
                    f"workdir -> {address.name}",
                    push_argv(
                        self.loaded.workdir,
                        address,
                        self.cluster.identity,
                        self.layout.workdir,
                        workdir=True,
                    ),
                )
            )
            for mount, source in zip(self.spec.data, self.loaded.data_sources, strict=True):
                transfers.append(
                    Transfer(
                        f"{mount.src} -> {address.name}:{mount.dst}",
                        push_argv(source, address, self.cluster.identity, mount.dst),
                    )
                )
        run_parallel(transfers)
        seconds = time.monotonic() - started
        self.ledger.add_event(
            self.job.id, "SYNCED", f"{len(transfers)} transfer(s), {seconds:.1f} s"
        )

    def _start(self) -> None:
        assert self.cluster is not None
        head = self.cluster.head
        port = int(head.run(launch.free_port_command()).stdout.strip())
        resume = self.keeper.prepare(self.cluster, **self._node_access())
        resume_from, resume_step = resume.path, resume.step
        resources = self.spec.resources
        cluster_launch = launch.ClusterLaunch(
            job_id=self.job.id,
            run=self.spec.run,
            setup=self.spec.setup,
            num_nodes=len(self.instances),
            procs_per_node=resources.gpus_per_node,
            master_addr=self.instances[0].private_ip,
            master_port=port,
            node_ips=[i.private_ip for i in self.instances],
            checkpoint_dir=self.layout.node_path(self.spec.checkpoint.dir),
            resume_from=resume_from,
            user_env=dict(self.spec.env),
        )

        self._check_guards()
        self._renew_guard_leases()  # heard from, and the run's own deadline, before it starts
        pids = start_on_nodes(self.cluster, cluster_launch)
        self._started = True
        self._awaiting_progress = True
        if self._driver is not None:
            self._driver.new_run()
        self._set_state(
            JobState.RUNNING,
            f"torchrun on {len(pids)} node(s), master {cluster_launch.master_addr}:{port}",
            started_at=self.job.started_at or utcnow(),
        )
        self._renew_guard_leases()
        if self.job.recoveries or resume_from:
            self.ledger.add_event(
                self.job.id, "RESUMED", f"from {resume_from}" if resume_from else
                "from the checkpoint files pulled so far (no complete step-* directory)",
                step=resume_step,
            )  # fmt: skip

    # --- the nodes' guards (see orchestrator.node.guard) -------------------------------------
    def _guard_terms(self) -> GuardTerms:
        """The job's limits for the guards of the nodes about to be launched.

        max_runtime counts from the job's start (its first RUNNING); before that, from now,
        which is earlier than any start: the guard never acts later than the controller would.
        The budget is what is left of `max_cost_usd` now."""
        budget, options = self.spec.budget, self.options
        now = utcnow()
        deadline = None
        if budget.max_runtime is not None:
            deadline = (self.job.started_at or now) + timedelta(seconds=budget.max_runtime)
        left = None
        if budget.max_cost_usd is not None:
            left = budget.max_cost_usd - self.ledger.spend(self.job.id, now)
        store_only = self.spec.checkpoint.mirror_mode == "none"
        pull_wait = options.store_only_wait if store_only else options.final_pull_wait
        return GuardTerms(
            job_id=self.job.id,
            interval_s=options.watch_interval,
            silence_s=max(10.0, 3 * options.watch_interval),
            allowance_s=options.stop_grace + pull_wait + options.stop_allowance + 30.0,
            deadman_s=options.deadman_timeout,
            stop_grace_s=options.stop_grace,
            upload_wait_s=pull_wait if self.spec.checkpoint.store else 0.0,
            idle_util_pct=options.idle_util_pct,
            idle_cpu_pct=options.idle_cpu_pct,
            runtime_deadline=deadline,
            budget_left_usd=left,
            idle_timeout_s=budget.idle_timeout,
            stop_allowance_s=options.stop_allowance,
        )

    def _check_guards(self) -> None:
        """Record whether every node's guard is armed and can power its node off; a guard that
        cannot act is a warning (the controller's own limits still hold while it lives)."""
        assert self.cluster is not None
        command = status_command(GuardLayout(self.job.id))

        def read(rank: int, connection: NodeConnection) -> str:
            return connection.run(command, timeout=15, check=False).stdout

        try:
            statuses = [parse_status(text) for text in self.cluster.map(read)]
        except OrchError as exc:
            self.ledger.add_event(self.job.id, "WARNING", f"could not read the guards: {exc}")
            return
        problems = [
            f"node {rank}: " + (status.problem or "no guard runs")
            for rank, status in enumerate(statuses)
            if not status.armed or status.problem
        ]
        if problems:
            text = "; ".join(problems)
            self.ledger.add_event(
                self.job.id, "WARNING", f"a guard cannot end its node without the controller: "
                f"{text}; keep this controller running, or fix the node's poweroff (sudo -n)",
            )  # fmt: skip
            self.reporter.line(f"[orch] warning: guard: {text}")
        else:
            self.ledger.add_event(self.job.id, "GUARDED", self._guard_summary(len(statuses)))

    def _guard_summary(self, nodes: int) -> str:
        budget = self.spec.budget
        limits = [
            f"max_runtime {budget.max_runtime:.0f} s" if budget.max_runtime else "",
            f"budget lease on ${budget.max_cost_usd}" if budget.max_cost_usd is not None else "",
            f"idle {budget.idle_timeout:.0f} s" if budget.idle_timeout else "",
        ]
        named = ", ".join(limit for limit in limits if limit) or "no limit: training runs on"
        return (
            f"guards armed on {nodes} node(s): {named}; dead-man "
            f"{self.options.deadman_timeout:.0f} s"
        )

    def _lease(self, now: datetime) -> str:
        """The lease the nodes get now: the run's deadline, and how long the rest of the
        budget lasts at the open leases' prices."""
        budget = self.spec.budget
        deadline = None
        if budget.max_runtime is not None:  # before the first start: the start about to be
            deadline = (self.job.started_at or now) + timedelta(seconds=budget.max_runtime)
        until = None
        if budget.max_cost_usd is not None:
            leases = self.ledger.leases(self.job.id)
            hourly = hourly_rate(leases)
            until = lease_until(
                now=now,
                budget_left_usd=budget.max_cost_usd - total_cost(leases, now),
                hourly_usd=hourly,
                reserve_s=self.options.stop_grace + self.options.stop_allowance,
            )
        return lease_document(now=now, runtime_deadline=deadline, lease_until=until)

    def _renew_guard_leases(self) -> None:
        """Write the lease to every node that answers (best effort: a node that misses it
        keeps its last lease, which never reaches past the budget)."""
        if self.cluster is None:
            return
        document = self._lease(utcnow())
        command = renew_command(GuardLayout(self.job.id))
        gone = set(self._gone_ranks)

        def renew(rank: int, connection: NodeConnection) -> None:
            if rank not in gone:
                connection.run(command, stdin=document, timeout=10, check=False)

        with contextlib.suppress(OrchError):
            self.cluster.map(renew)

    def _ended_by_guard(self, instance_ids: tuple[str, ...]) -> StopOrder | None:
        """The stop for nodes that powered themselves off: their guard acted on a limit, so
        the job ends as that limit says instead of launching new nodes. Their leases close at
        the time the provider says they ended."""
        if not instance_ids:
            return None
        ended = self.provider.self_ended(list(instance_ids))
        if not ended:
            return None
        self._close_self_ended(ended)
        first = min(ended.values(), key=lambda end: end.at or utcnow())
        words = f"node(s) {', '.join(sorted(ended))} powered themselves off: {first.message}"
        kind = first.kind or self._limit_behind(first.at or utcnow())
        states = {
            "max_runtime": (JobState.TIMED_OUT, 1),
            "budget": (JobState.BUDGET_STOPPED, 4),
            "idle": (JobState.IDLE_STOPPED, 1),
        }
        state, code = states.get(kind, (JobState.FAILED, 1))
        if not first.kind and kind:
            words += f" (by the job's limits at that time: {kind})"
        if kind == "deadman":
            words += " (the run had ended while no controller watched; its exit code is lost)"
        return StopOrder(state, code, words)

    def _limit_behind(self, at: datetime) -> str:
        """Which limit a guard most likely acted on when nodes powered themselves off at `at`
        and the provider cannot say why (EC2 keeps no word of it)."""
        budget = self.spec.budget
        leases = self.ledger.leases(self.job.id)
        hourly = hourly_rate(leases)
        return guard_limit_at(
            at=at,
            started_at=self.job.started_at,
            max_runtime_s=budget.max_runtime,
            spend=total_cost(leases, at),
            max_cost=budget.max_cost_usd,
            reserve_usd=hourly
            * Decimal(str(self.options.stop_grace + self.options.stop_allowance))
            / 3600,
            idle_timeout_s=budget.idle_timeout,
        )

    def _close_self_ended(self, ended: dict[str, NodeEnd]) -> None:
        for instance_id, end in ended.items():
            if end.at is not None:
                self.ledger.close_leases([instance_id], end.at)

    def _node_access(self) -> dict[str, object]:
        """What the nodes bring to the checkpoint store: credentials of their own (an instance
        profile) or none, and their region."""
        instances = self.cluster.instances if self.cluster is not None else []
        return {
            "nodes_have_credentials": bool(instances) and all(i.credentials for i in instances),
            "region": instances[0].region if instances else None,
        }

    # --- supervision: APScheduler runs the periodic work, the main thread waits --------------
    def _supervise(self) -> StopOrder | Interruption | PlannedMove:
        """Watch until the run ends, a policy stops it, nodes are interrupted, or the spot
        policy moves the job; returns how the job ends, the interruption to recover from, or
        the planned move.

        Each periodic task runs in the scheduler's threads; the first one that reaches a
        decision (or fails) sets it and wakes the main thread, which is the only thread that
        ever tears down. Ctrl-C lands in the main thread as KeyboardInterrupt.
        """
        assert self.cluster is not None
        self._watch = self._run_watch()
        self._gone_ranks = set()
        notices = NoticeWatcher(
            self.cluster, self._on_notice, interval_s=self.options.notice_poll_interval
        )
        self._activity = JobActivity(
            self.job.id,
            self.cluster,
            self.layout,
            interval_s=self.options.watch_interval,
            gpus_per_node=self.spec.resources.gpus_per_node,
            idle_timeout_s=self.spec.budget.idle_timeout,
            thresholds=ActivityThresholds(
                self.options.idle_util_pct,
                self.options.idle_cpu_pct,
                self.options.gpu_sample_every,
            ),
            record=self.ledger.add_gpu_samples,
        )
        self._activity.start()
        notices.start()
        self._decision: StopOrder | Interruption | PlannedMove | None = None
        self._failure: BaseException | None = None
        self._decided = threading.Event()
        now = datetime.now(UTC)
        scheduler = BackgroundScheduler(
            timezone=UTC,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        scheduler.add_job(
            self._guarded(self._tick_watch), "interval",
            seconds=self.options.watch_interval, next_run_time=now,
        )  # fmt: skip
        scheduler.add_job(
            self._guarded(self._tick_activity), "interval",
            seconds=self.options.watch_interval, next_run_time=now,
        )  # fmt: skip
        scheduler.add_job(
            self._guarded(self._tick_budget), "interval",
            seconds=self.options.budget_interval, next_run_time=now,
        )  # fmt: skip
        if self._driver is not None:
            scheduler.add_job(
                self._guarded(self._tick_policy), "interval",
                seconds=self.options.policy_interval,
            )  # fmt: skip
        scheduler.start()
        self.keeper.watch(self.cluster, gone=lambda: set(self._gone_ranks), on_failure=self._decide)
        try:
            while not self._decided.wait(0.2):
                pass
        finally:
            self._abort_gone_connections()
            self.keeper.stop_watching()
            scheduler.shutdown(wait=True)
            notices.stop()
            self._activity.stop()
        if self._failure is not None:
            raise self._failure
        assert self._decision is not None
        return self._decision

    def _abort_gone_connections(self) -> None:
        """Drop the connections of nodes found gone (lost, reclaimed, downed): a task still
        waiting on one (a checkpoint pull, a CPU reading) ends now rather than at the
        keepalive timeout, so the decision is acted on seconds sooner."""
        if self.cluster is None:
            return
        for rank in self._gone_ranks:
            self.keeper.node_gone(rank)  # a checkpoint transfer from it is killed too
            self.cluster.connections[rank].abort()

    def _guarded(self, task: Callable[[], None]) -> Callable[[], None]:
        def run_task() -> None:
            if self._decided.is_set():
                return
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                if self._decided.is_set():
                    # A task cut short by the decision (a pull from a node found gone) must
                    # not turn a recovery into a failure: the decision stands.
                    self.reporter.line(f"[orch] after the decision, a check failed: {exc}")
                    return
                self._failure = exc
                self._decided.set()

        return run_task

    def _run_watch(self) -> RunWatch:
        assert self.cluster is not None
        return RunWatch(
            self.cluster,
            self.layout,
            self.job_dir / "logs",
            on_metrics=self._record_metrics,
            on_line=self.reporter.line,
            lost_after=self.options.lost_after,
            probe_timeout=max(self.options.probe_timeout, self.options.watch_interval),
            max_log_bytes=self.settings.logs.max_bytes,
            log_keep=self.settings.logs.keep,
        )

    def _decide(self, order: StopOrder | Interruption | PlannedMove) -> None:
        if not self._decided.is_set():
            self._decision = order
            self._decided.set()

    def _on_notice(self, rank: int, notice: SpotNotice) -> None:
        instance = self.instances[rank]
        when = notice.time.isoformat() if notice.time else "an unstated time"
        self._decide(
            Interruption(
                (rank,),
                (instance.instance_id,),
                "notice",
                f"spot interruption notice ({notice.action} at {when})",
                utcnow(),
                notice.time,
            )  # fmt: skip
        )

    def _tick_watch(self) -> None:
        assert self._watch is not None
        try:
            verdict = self._watch.tick()
        except NodeLost as lost:
            self._gone_ranks.add(lost.rank)
            ended = self._ended_by_orch((lost.rank,)) or self._ended_by_guard(
                (self.instances[lost.rank].instance_id,)
            )
            self._decide(ended or self._gone((lost.rank,), str(lost.message)))
            return
        missing = tuple(rank for rank, misses in enumerate(self._watch.misses) if misses)
        if missing:
            # One missed probe is not a loss, unless the node's lease was closed by `orch down`
            # or the provider says it took the node.
            ended = self._ended_by_orch(missing)
            if ended is not None:
                self._gone_ranks.update(missing)
                self._decide(ended)
                return
            taken = self.provider.preempted([self.instances[r].instance_id for r in missing])
            if taken:
                ranks = tuple(r for r in missing if self.instances[r].instance_id in taken)
                self._gone_ranks.update(ranks)
                self._decide(self._gone(ranks, "reclaimed by the provider"))
                return
        if verdict.done:
            if verdict.failed_rank is not None:
                if missing:
                    return  # a peer stopped answering: wait until it is back or confirmed lost
                self._fail_with_tail(verdict.failed_rank, verdict.exit_code)
            self._decide(StopOrder(JobState.SUCCEEDED, 0, ""))
            return
        started = self.job.started_at or utcnow()
        order = runtime_order(
            elapsed_s=(utcnow() - started).total_seconds(),
            max_runtime_s=self.spec.budget.max_runtime,
        )
        if order is not None:
            self._decide(order)

    def _tick_activity(self) -> None:
        """Read every node's GPUs (or the job's CPU use) and stop the job once idle too long.

        A task of its own: a reading from a node that stopped answering can take as long as
        the connection's timeouts, and must not hold up the liveness checks of `_tick_watch`.
        While a node misses checks it cannot be judged idle, so nothing is read then.
        """
        if self._watch is not None and any(self._watch.misses):
            return
        order = idle_order(
            idle_for_s=self._activity.tick(),
            idle_timeout_s=self.spec.budget.idle_timeout,
            what=self._activity.what,
        )
        if order is not None:
            self._decide(order)

    def _ended_by_orch(self, ranks: tuple[int, ...]) -> StopOrder | None:
        """The stop for nodes that another orch command ended (`orch down`, which closes their
        leases): they were taken on purpose, so the job ends instead of launching new ones."""
        ids = {self.instances[rank].instance_id for rank in ranks}
        closed = sorted(
            lease.instance_id
            for lease in self.ledger.leases(self.job.id)
            if lease.instance_id in ids and lease.ended_at is not None
        )
        if not closed:
            return None
        return StopOrder(
            JobState.CANCELLED,
            JobCancelled.exit_code,
            f"node(s) {', '.join(closed)} were shut down by another orch command (orch down)",
        )

    def _gone(self, ranks: tuple[int, ...], detail: str) -> Interruption:
        """The interruption for nodes found gone, labelled by what the provider says."""
        ids = tuple(self.instances[rank].instance_id for rank in ranks)
        taken = self.provider.preempted(list(ids))
        cause = "preempted" if taken else "lost"
        return Interruption(ranks, ids, cause, detail, utcnow())

    def _tick_budget(self) -> None:
        leases = self.ledger.leases(self.job.id)
        hourly = hourly_rate(leases)
        order = budget_order(
            spend=total_cost(leases, utcnow()),
            hourly_rate=hourly,
            max_cost=self.spec.budget.max_cost_usd,
            max_hourly=self.spec.budget.max_hourly_usd,
            horizon_s=self.options.budget_interval + self.options.stop_allowance,
        )
        if order is not None:
            self._decide(order)
            return
        if self.spec.budget.max_cost_usd is not None or self.spec.budget.max_runtime:
            self._renew_guard_leases()

    def _record_metrics(self, metrics: Metrics, read_at: float) -> None:
        self.reporter.metrics(metrics)
        self._last_step = metrics.step
        if self._driver is not None:
            self._driver.observe(metrics, read_at)
        if self._awaiting_progress:
            self._awaiting_progress = False
            self.ledger.add_event(
                self.job.id, PROGRESS_EVENT, f"first progress of this run: step {metrics.step}",
                step=metrics.step,
            )  # fmt: skip
        now = time.monotonic()
        if now - self._last_step_saved >= 2.0:
            fields: dict[str, object] = {"step": metrics.step}
            if metrics.loss is not None:
                fields["loss"] = metrics.loss
            self.ledger.update_job(self.job.id, **fields)
            self._last_step_saved = now

    # --- ownership and identity ----------------------------------------------------------------
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
                self.ledger.add_event(self.job.id, "REFUSED", str(exc), step=self.job.step)
            raise
        if self.job.identity is None:
            self.job = self.ledger.update_job(self.job.id, identity=current.to_json())

    def _ours(self, instances: list[Instance]) -> list[Instance]:
        """Those of `instances` that are this ledger's (`orchestrator.control.ownership`)."""
        leased = {lease.instance_id for lease in self.ledger.leases(self.job.id)}
        return partition(instances, self.ledger.ledger_id, leased=leased).ours

    # --- adoption -------------------------------------------------------------------------------
    def _adopt(self, *, require_all: bool) -> Interruption | None:
        """Take over the job's running nodes after a controller died; training goes on.

        With `require_all`, recorded nodes that are gone (reclaimed or lost while the job had
        no controller) come back as the interruption to recover from.
        """
        instances = self._ours(self.provider.list_owned(job_id=self.job.id))
        running = {i.instance_id for i in instances}
        missing = [
            lease
            for lease in self.ledger.leases(self.job.id, open_only=True)
            if lease.instance_id not in running
        ]
        self.instances = sorted(instances, key=lambda i: i.rank)
        if require_all and (missing or not instances):
            ids = tuple(lease.instance_id for lease in missing)
            taken = self.provider.preempted(list(ids)) if ids else set()
            return Interruption(
                tuple(lease.rank for lease in missing), ids,
                "preempted" if taken else "lost",
                "found gone when a new controller took the job over", utcnow(),
            )  # fmt: skip
        if not self.instances:
            return None
        identity = ensure_identity(self.settings.keys_dir(self.job.id), f"orch-{self.job.id}")
        self.cluster = Cluster(
            self.instances, identity, connect_timeout=self.options.connect_timeout
        )
        self._started = True
        self._last_step = self.job.step
        try:
            self.keeper.adopt(self.cluster, **self._node_access())
        except OrchError as exc:
            self.ledger.add_event(self.job.id, "WARNING", f"checkpoint agents: {exc}")
        self.ledger.add_event(
            self.job.id, "ADOPTED", f"controller {controller_identity()} took over "
            f"{len(self.instances)} node(s)", step=self.job.step,
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
            self._stop_trainers(grace)
        skip = self._unanswering(interruption)
        if len(skip) < len(self.instances):
            wait = salvage_seconds(interruption, utcnow(), self.options.final_pull_wait)
            try:
                self.keeper.finish(skip=skip, wait_s=wait if interruption.cause == "notice" else 0)
            except OrchError as exc:
                self.ledger.add_event(self.job.id, "WARNING", f"salvage pull failed: {exc}")
        if interruption.cause == "notice" and self._watch is not None:
            with contextlib.suppress(OrchError):
                self._watch.catch_up()
        newest = self.keeper.newest()
        self.ledger.add_event(
            self.job.id, "SALVAGED", f"newest checkpoint {newest.name if newest else 'none'}, "
            f"{time.monotonic() - started:.1f} s after detection",
            step=newest.step if newest else None,
        )  # fmt: skip

    def _unanswering(self, interruption: Interruption) -> set[int]:
        """Nodes not to ask for checkpoints after an interruption: those lost or taken, and
        those that missed the last probe or that the provider reports taken meanwhile (asking
        them would cost a connection timeout). After a notice every node still runs."""
        if interruption.cause == "notice" or not self.instances:
            return set()
        skip = set(interruption.ranks) | set(self._gone_ranks)
        if self._watch is not None:
            skip |= {rank for rank, misses in enumerate(self._watch.misses) if misses}
        rest = [i for i in self.instances if i.rank not in skip]
        taken = self.provider.preempted([i.instance_id for i in rest]) if rest else set()
        return skip | {i.rank for i in rest if i.instance_id in taken}

    def _note_interruption(self, interruption: Interruption) -> None:
        self.ledger.add_event(
            self.job.id, "PREEMPTED", f"{interruption.cause}: {interruption.describe()}",
            step=self._last_step,
        )  # fmt: skip
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
        self._set_state(
            JobState.RECOVERING,
            f"recovery {done + 1} of {limit}: replacing {len(self.instances) or 'the'} node(s)",
            recoveries=done + 1,
        )
        taken = set(interruption.instance_ids)
        self._avoid_zones = tuple(
            {i.zone for i in self.instances if i.instance_id in taken} - {None}
        )
        self._terminate_all()
        if self.cluster is not None:
            self.cluster.close()
        self.cluster, self.instances, self._started, self._watch = None, [], False, None

    def _restart_from_scratch(self) -> None:
        """The controller died before training started: end what it launched, start over."""
        self.ledger.add_event(
            self.job.id, "RESTARTED", f"found {self.job.state} without a controller; its "
            "nodes are replaced",
        )  # fmt: skip
        self._terminate_all()

    def _fail_with_tail(self, rank: int, exit_code: int | None) -> None:
        assert self.cluster is not None
        tail = ""
        with contextlib.suppress(OrchError):
            tail = (
                self.cluster.connections[rank]
                .run(f"tail -n 30 {launch.home_expr(self.layout.log)}", timeout=15, check=False)
                .stdout.rstrip()
            )
        what = (
            "the setup command failed"
            if exit_code == launch.SETUP_FAILED_EXIT
            else f"torchrun exited with code {exit_code}"
        )
        raise JobFailed(
            f"node {rank}: {what}\n--- last lines of node {rank}'s log ---\n{tail}",
            hint=f"full log: orch logs {self.job.id} --node {rank}",
        )

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

    def _bring_up_on_policy(self, first: Decision | None = None) -> StopOrder | None:
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
            if decision is Decision.WAIT:
                order = self._hold(driver)
                if order is not None:
                    return order
                decision = driver.market or Decision.ON_DEMAND
            driver.commit(decision)
            try:
                self._bring_up()
                return None
            except CapacityError:
                if decision is not Decision.SPOT:
                    raise
                driver.spot_refused()
                decision = driver.decide_idle(self._resume_step())

    def _hold(self, driver: DeadlineDriver) -> StopOrder | None:
        """Wait with no node (nothing billed) until the policy says run; None then."""
        if self.job.state != JobState.WAITING:
            self._set_state(JobState.WAITING, f"{driver.policy.name}: no node until it says run")
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
            if driver.decide_idle(self._resume_step()) is not Decision.WAIT:
                return None

    def _tick_policy(self) -> None:
        assert self._driver is not None
        market = self.instances[0].market if self.instances else None
        move = self._driver.tick(market, self._last_step)
        if move is not None:
            self._decide(move)

    def _move(self, move: PlannedMove) -> None:
        """Carry out a planned move of the spot policy; not a recovery (`switches` counts it).

        Intent first: the policy's new market, then SWITCHING (or WAITING) are written; then
        the trainers get SIGTERM and checkpoint, the checkpoint is pulled and the nodes ended.
        """
        assert self._driver is not None
        self._driver.commit(move.to)
        switches = self.job.switches + 1
        state = JobState.WAITING if move.to is Decision.WAIT else JobState.SWITCHING
        self._set_state(state, f"switch {switches}: {move.describe()}", switches=switches)
        started = time.monotonic()
        self._end_nodes()
        newest = self.keeper.newest()
        self.ledger.add_event(
            self.job.id, SWITCHED_EVENT, f"{move.source.value} -> {move.to.value}: nodes ended "
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
        if self.cluster is not None and self._started:
            self._stop_trainers(self.options.stop_grace)
            try:
                self._final_pull()
            except OrchError as exc:
                self.ledger.add_event(self.job.id, "WARNING", f"pull before the move: {exc}")
            if self._watch is not None:
                with contextlib.suppress(OrchError):
                    self._watch.catch_up()
        self._terminate_all()
        if self.cluster is not None:
            self.cluster.close()
        self.cluster, self.instances, self._started, self._watch = None, [], False, None

    def _resume_step(self) -> int | None:
        """The step a start now would resume from."""
        newest = self.keeper.newest()
        if newest is not None and newest.step is not None:
            return newest.step
        return self._last_step if self._last_step is not None else self.job.step

    # --- checkpoints and logs --------------------------------------------------------------
    def _final_pull(self) -> None:
        """Collect what the run left, once the nodes' agents staged it (bounded wait; longer
        when the store holds the only copy)."""
        wait = (
            self.options.store_only_wait
            if self.spec.checkpoint.mirror_mode == "none"
            else self.options.final_pull_wait
        )
        self.keeper.finish(skip=self._gone_ranks, wait_s=wait)

    def _catch_up_logs(self) -> None:
        if self._watch is None:
            self._watch = self._run_watch()
        self._watch.catch_up(skip=self._gone_ranks)

    def _stop_trainers(self, grace_s: float) -> None:
        """SIGTERM the run on every node and wait (bounded) for it to checkpoint and exit.

        Nodes found gone are left out (each would cost a connect timeout), and then nothing
        is waited for: a job that lost a node cannot finish a collective step, and torchrun on
        the others waits for its lost peer far longer than any grace. A node that merely
        missed a check still gets its SIGTERM and its wait."""
        assert self.cluster is not None
        unanswering = set(self._gone_ranks)

        def stop(rank: int, connection: NodeConnection) -> None:
            if rank not in unanswering:
                connection.run(launch.stop_command(self.layout), timeout=15, check=False)

        with contextlib.suppress(OrchError):
            self.cluster.map(stop)
        if unanswering:
            return

        def probe(rank: int, connection: NodeConnection) -> launch.NodeProbe:
            command = launch.probe_command(self.layout, None)
            return launch.parse_probe(connection.run(command, timeout=15, check=False).stdout)

        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                probes = self.cluster.map(probe)
            except OrchError:
                return
            if all(p.state != "running" for p in probes):
                return
            time.sleep(0.5)

    # --- teardown ---------------------------------------------------------------------------
    def _teardown(self, order: StopOrder) -> None:
        """Salvage what can be salvaged, then end every node of the job and close its leases.

        The final state is written first (as `stop_state`, with the job STOPPING), so a
        controller that adopts a half-finished stop knows how the job must end. Every ledger
        write here is best effort (`DeferredWrites`): a ledger that refuses writes never keeps
        the nodes from ending; what it refused is tried once more after the termination, and
        what it still refuses is saved under ORCH_HOME/unrecorded/ for `orch reconcile`.
        """
        reason = order.reason or None
        writes = self._writes
        writes.write(
            "the job's stop (STOPPING)",
            lambda: self.ledger.update_job(
                self.job.id,
                state=JobState.STOPPING,
                stop_state=order.state.value,
                exit_code=order.exit_code,
                reason=reason,
            ),
        )
        writes.write(
            "the STOPPING event",
            lambda: self.ledger.add_event(
                self.job.id,
                "STOPPING",
                f"{order.state.value}: {reason or 'finished'}",
                step=self._last_step,
            ),  # fmt: skip
        )
        self.reporter.phase(
            f"stopping ({order.state.value}): pulling checkpoints and logs, shutting nodes down"
        )
        if self.cluster is not None and self._started:
            if order.state is not JobState.SUCCEEDED:
                self._stop_trainers(self.options.stop_grace)
            for salvage in (self._final_pull, self._catch_up_logs):
                try:
                    salvage()
                except Exception as exc:  # noqa: BLE001 - nothing may keep the nodes from ending
                    self._warn(f"during teardown: {exc}")
        ended_at = self._terminate_all()
        if self.cluster is not None:
            self.cluster.close()
        try:
            self.keeper.sweep_store()
        except Exception as exc:  # noqa: BLE001 - the job's end is recorded whatever happens here
            self._warn(f"store cleanup: {exc}")
        step = self._last_step if self._last_step is not None else self.job.step
        writes.write(
            f"the job's end ({order.state.value})",
            lambda: self.ledger.update_job(
                self.job.id,
                state=order.state,
                ended_at=ended_at,
                exit_code=order.exit_code,
                reason=reason,
                step=step,
            ),  # fmt: skip
        )
        writes.write(
            f"the {order.state.value} event",
            lambda: self.ledger.add_event(
                self.job.id, order.state.value, reason or "", step=self._last_step
            ),
        )
        if writes.retry():
            self._save_unrecorded(
                UnrecordedEnd(
                    self.job.id,
                    list(self._unclosed),
                    order.state,
                    order.exit_code,
                    reason,
                    step,
                    ended_at,
                )  # fmt: skip
            )
        self.reporter.phase(order.state.value.lower())

    def _warn(self, message: str) -> None:
        """A WARNING event, best effort (see `_teardown`)."""
        self._writes.write(
            "a warning", lambda: self.ledger.add_event(self.job.id, "WARNING", message)
        )

    def _save_unrecorded(self, record: UnrecordedEnd) -> None:
        """Keep what the ledger refused for `orch reconcile`, and say so."""
        ended = ", ".join(f"{' '.join(ids)} at {at.isoformat()}" for ids, at in record.ended)
        try:
            path = save_unrecorded(self.settings.home, record)
        except OSError as exc:
            self.reporter.line(
                f"[orch] could not save the unwritten records either ({exc}); the job ended "
                f"{record.state}, nodes ended: {ended or 'none'}"
            )
            return
        self.reporter.line(
            f"[orch] every node is ended; what the ledger refused is kept in {path}: "
            "`orch reconcile` writes it once the ledger takes writes again"
        )

    def _terminate_all(self) -> datetime:
        """Terminate the recorded nodes and anything else of this ledger the provider runs for
        this job.

        Ids the provider cannot find at all (`InstancesNotFound`) have their leases closed
        too: `run` checked that this controller acts as the job's identity, so the cloud forgot
        them (they ended long ago). The termination never waits on the ledger: its writes
        (leases of nodes launched without one, the leases' end, the event) are best effort
        (`self._writes`); a lease whose end was not written is kept in `self._unclosed` with
        the provider's end time. Nodes that powered themselves off are billed until they did.
        """
        ids = {i.instance_id for i in self.instances}
        try:
            ids |= {lease.instance_id for lease in self.ledger.leases(self.job.id, open_only=True)}
        except LEDGER_FAILURES as exc:
            self.reporter.line(f"[orch] could not read the job's leases ({exc}); ending the rest")
        owned: list[Instance] = []
        try:
            owned = self._ours(self.provider.list_owned(job_id=self.job.id))
            ids |= {i.instance_id for i in owned}
        except OrchError as exc:
            self._warn(f"could not list nodes: {exc}")
        if not ids:
            return utcnow()
        # A launch cut short (a controller killed before it wrote the leases) left nodes that
        # bill without a lease: they get one before they end, so the bill holds their seconds.
        known = [*self.instances, *owned]
        try:
            self._writes.write(
                "leases of nodes launched without one",
                lambda: lease_unrecorded(
                    self.ledger, self.provider, self.job.id, sorted(ids), known=known
                ),
            )
        except OrchError as exc:
            self.reporter.line(f"[orch] could not describe unleased nodes: {exc}")
        with contextlib.suppress(OrchError, *LEDGER_FAILURES):
            self._close_self_ended(self.provider.self_ended(sorted(ids)))
        try:
            ended_at = self.provider.terminate(sorted(ids))
        except InstancesNotFound as exc:
            ended_at = exc.ended_at or utcnow()
            self._warn(f"{exc.message}; their leases end now")
        if not self._writes.write(
            f"the end of {len(ids)} lease(s) at {ended_at.isoformat()}",
            lambda: self.ledger.close_leases(ids, ended_at),
        ):
            self._unclosed.append((sorted(ids), ended_at))
        self._writes.write(
            "the TERMINATED event",
            lambda: self.ledger.add_event(self.job.id, "TERMINATED", f"{len(ids)} node(s)"),
        )
        return ended_at


def start_on_nodes(cluster: Cluster, cluster_launch: launch.ClusterLaunch) -> list[str]:
    """Write each node's launch script and start it detached; returns the pids, by rank.

    Refuses (RemoteError) to start a node whose run was already started.
    """
    layout = cluster_launch.layout

    def start(rank: int, connection: NodeConnection) -> str:
        node = launch.NodeLaunch(rank, cluster.instances[rank].interface)
        script = launch.launch_script(cluster_launch, node)
        # 0700: the script holds the spec's env values, which may be secrets
        connection.run(
            launch.write_file_command(f"{layout.run_dir}/launch.sh", "0700"), stdin=script
        )
        return connection.run(launch.start_command(layout)).stdout.strip()

    return cluster.map(start)
