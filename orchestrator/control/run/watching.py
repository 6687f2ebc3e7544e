"""Watching a started run until something must be done about it.

`Supervisor.watch` runs the periodic checks (APScheduler threads) and returns ONE decision:
a `StopOrder` (the job ends), an `Interruption` (nodes to replace), a `PlannedMove` (the
spot policy moves the job) or a `FailedStart` (the run made no progress after its start).
Each check returns a decision or None; the first decision (or the first check that fails)
wins, and it is the main thread that acts on it.

The run's check pulls rank 0's log every `EARLY_PEEK_S` for the first `EARLY_WINDOW_S` of a
watch, until rank 0's first progress line (`RunPace`): a person who just started a run sees
its first step within a fraction of a second of its printing, not up to a whole watch
interval later. The other nodes are asked, and the run judged, at the usual interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

from orchestrator.cluster.activity import ActivityThresholds, JobActivity
from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.cluster.notice_watch import NoticeWatcher
from orchestrator.cluster.run_watch import RunWatch, copied_progress
from orchestrator.cluster.start_reports import start_reports
from orchestrator.config import Settings
from orchestrator.control.money.stop_rules import (
    StopOrder,
    budget_order,
    idle_order,
    runtime_order,
    stall_order,
)
from orchestrator.control.money.team_caps import TeamCaps
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter, RunnerOptions
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.start_rules import FailedStart, hang_reason
from orchestrator.errors import JobCancelled, JobFailed, NodeLost, OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import hourly_rate, total_cost, utcnow
from orchestrator.node import launch
from orchestrator.node.failure import cluster_failure, failure_report
from orchestrator.node.progress import Metrics
from orchestrator.node.run_progress import ProgressClock
from orchestrator.node.spot_notice import SpotNotice
from orchestrator.providers.base import Provider
from orchestrator.spec.model import JobSpec
from orchestrator.spot.driver import DeadlineDriver, PlannedMove

# What a watch hands back to the runner: end the job, recover, move it, or restart its start.
# (`spot.policies.Decision` is the spot policy's choice of market, a different thing.)
Verdict = StopOrder | Interruption | PlannedMove | FailedStart

EARLY_PEEK_S = 0.2  # how often rank 0's log is pulled while a watch waits on its first step
EARLY_WINDOW_S = 60.0  # how long a watch does that at most
RUN_CHECK = "run"  # the scheduler's id of the run's check


class _SkippedTurnsUnsaid(logging.Filter):
    """Drops APScheduler's line for a check skipped because its previous run still goes on.

    That is by design (one run of a check at a time): a check waits up to `probe_timeout` on a
    node that does not answer, and would otherwise put a line a second in controller.log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in record.getMessage()


def check_scheduler() -> BackgroundScheduler:
    """A scheduler for periodic checks: one run of each at a time, late turns merged into one,
    in UTC. Not started."""
    logger = logging.getLogger("orchestrator.control.checks")
    if not any(isinstance(known, _SkippedTurnsUnsaid) for known in logger.filters):
        logger.addFilter(_SkippedTurnsUnsaid())
    return BackgroundScheduler(
        timezone=UTC,
        logger=logger,
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
    )


OnMetrics = Callable[[Metrics, float], None]  # (metrics, time.monotonic() of the reading)


class RunPace:
    """When the run's check asks every node (`check_run`) and when it only pulls rank 0's log
    (`RunWatch.peek`), for one watch that started at `started` (`time.monotonic()`).

    Early on (`early`), the check runs every `peek_s`: a full check when `interval_s` passed
    since the last one (the first at once), a peek otherwise. So a node's liveness is judged
    at the usual pace, and rank 0's first lines are read soon after they are printed, at the
    cost of one small command every `peek_s` whatever the cluster's size. The early pace ends
    for good (`settle`) at rank 0's first progress line, once a node missed a check (its
    waits are the full checks'), or `window_s` after the start; the check then runs every
    `interval_s`. With `interval_s` no longer than `peek_s` there is no early pace.
    """

    def __init__(
        self,
        interval_s: float,
        started: float,
        *,
        peek_s: float = EARLY_PEEK_S,
        window_s: float = EARLY_WINDOW_S,
    ) -> None:
        self.interval_s = interval_s
        self.peek_s = peek_s
        self.early = peek_s < interval_s
        self._until = started + window_s
        self._last_full: float | None = None

    @property
    def every_s(self) -> float:
        """How often the check runs now."""
        return self.peek_s if self.early else self.interval_s

    def full_check_due(self, now: float) -> bool:
        """Whether the check at `now` asks every node; if so, it counts as done at `now`."""
        # Half a peek of slack: a turn that fires a hair early is not put off a whole peek.
        due = (
            not self.early
            or self._last_full is None
            or now - self._last_full >= self.interval_s - self.peek_s / 2
        )
        if due:
            self._last_full = now
        return due

    def settle(self, watch: RunWatch, now: float) -> bool:
        """True once, when the early pace ends (the caller runs the check every `interval_s`
        from then on); False while it goes on, and ever after."""
        if not self.early:
            return False
        if watch.progress_seen or any(watch.misses) or now >= self._until:
            self.early = False
            return True
        return False


class _First:
    """The first decision (or failure) of the checks, handed to the main thread."""

    def __init__(self) -> None:
        self.decision: Verdict | None = None
        self.failure: BaseException | None = None
        self.reached = threading.Event()

    def decide(self, decision: Verdict | None) -> None:
        if decision is not None and not self.reached.is_set():
            self.decision = decision
            self.reached.set()

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        self.reached.set()


class Supervisor:
    """Watches one attempt; `watch` may be called once per started run."""

    def __init__(
        self,
        *,
        journal: Journal,
        spec: JobSpec,
        layout: launch.NodeLayout,
        logs_dir: Path,
        settings: Settings,
        options: RunnerOptions,
        provider: Provider,
        reporter: Reporter,
        keeper: CheckpointKeeper,
        guards: Guards,
        driver: DeadlineDriver | None,
        team: TeamCaps | None,
        on_metrics: OnMetrics,
    ) -> None:
        """`logs_dir`: where the nodes' logs are pulled to; `driver`: the spot policy, whose
        planned moves are checked (None: none); `team`: the monthly caps (None: none set)."""
        self.journal = journal
        self.spec = spec
        self.layout = layout
        self.logs_dir = logs_dir
        self.settings = settings
        self.options = options
        self.provider = provider
        self.reporter = reporter
        self.keeper = keeper
        self.guards = guards
        self.driver = driver
        self.team = team
        self.on_metrics = on_metrics

    @property
    def _job_id(self) -> str:
        return self.journal.job.id

    def run_watch(self, attempt: Attempt) -> RunWatch:
        return RunWatch(
            attempt.cluster,
            self.layout,
            self.logs_dir,
            on_metrics=self.on_metrics,
            on_line=self.reporter.line,
            lost_after=self.options.lost_after,
            probe_timeout=max(self.options.probe_timeout, self.options.watch_interval),
            max_log_bytes=self.settings.logs.max_bytes,
            log_keep=self.settings.logs.keep,
            unprefixed_is_rank0=self.spec.launcher == "none",
            # A late probe asks the provider at once: a node it took is found in seconds.
            confirm_gone=lambda ranks: self._taken(attempt, ranks),
            progress_pattern=self.spec.progress.pattern,
        )

    def copied_progress(self, instance_id: str) -> Metrics | None:
        """The newest progress in the log copy of rank 0's node `instance_id`
        (`run_watch.copied_progress`): for a controller taking over the job."""
        return copied_progress(
            self.logs_dir, instance_id,
            progress_pattern=self.spec.progress.pattern,
            unprefixed_is_rank0=self.spec.launcher == "none",
        )  # fmt: skip

    def _taken(self, attempt: Attempt, ranks: list[int]) -> bool:
        """Whether the provider says it took any of these nodes; False when it cannot say now
        (the check's own miss, later, asks again and fails the check if it must)."""
        try:
            return bool(self.provider.preempted(attempt.ids(ranks)))
        except OrchError:
            return False

    def watch(self, attempt: Attempt) -> Verdict:
        """Watch until the run ends, a limit stops it, nodes are interrupted, or the spot
        policy moves the job; returns that decision. A check that fails raises here (a
        `JobFailed` when the run failed on a node). Ctrl-C lands in the main thread as
        KeyboardInterrupt; the nodes keep running (and billing) either way: ending them is the
        runner's.
        """
        options = self.options
        cluster = attempt.cluster
        run_watch = attempt.watch = self.run_watch(attempt)
        run_watch.clock = self.progress_clock(attempt)
        attempt.gone_ranks = set()
        first = _First()
        notices = NoticeWatcher(
            cluster, lambda rank, notice: first.decide(self._notice(attempt, rank, notice))
        )
        activity = JobActivity(
            self._job_id,
            cluster,
            self.layout,
            interval_s=options.watch_interval,
            gpus_per_node=self.spec.resources.gpus_per_node,
            idle_timeout_s=self.spec.budget.idle_timeout,
            thresholds=ActivityThresholds(
                options.idle_util_pct, options.idle_cpu_pct, options.gpu_sample_every
            ),
            record=self.journal.ledger.add_gpu_samples,
        )
        activity.start()
        notices.start()
        now = datetime.now(UTC)
        scheduler = check_scheduler()
        pace = RunPace(options.watch_interval, time.monotonic())

        settled = threading.Event()  # the early pace ended: the main thread reschedules

        def paced_check_run() -> Verdict | None:
            decision = self.paced_check_run(attempt, pace)
            if pace.settle(run_watch, time.monotonic()):
                settled.set()
            return decision

        scheduler.add_job(
            self._guarded(paced_check_run, first), "interval", seconds=pace.every_s,
            next_run_time=now, id=RUN_CHECK,
        )  # fmt: skip
        for check, seconds in (
            (lambda: self.check_activity(attempt, activity), options.watch_interval),
            (lambda: self.check_budget(attempt), options.budget_interval),
        ):
            scheduler.add_job(
                self._guarded(check, first), "interval", seconds=seconds, next_run_time=now
            )
        if self.driver is not None:
            driver = self.driver
            scheduler.add_job(  # first decision one interval in (the launch was just decided)
                self._guarded(
                    lambda: driver.tick(attempt.market, self._last_step(), attempt.zone), first
                ),
                "interval",
                seconds=options.policy_interval,
            )
        scheduler.start()
        self.keeper.watch(
            cluster,
            gone=lambda: set(attempt.gone_ranks),
            on_failure=lambda reason: first.decide(StopOrder(JobState.FAILED, 1, reason)),
        )
        try:
            while not first.reached.wait(0.2):
                # Here, never in the check itself: a check that reschedules while the main
                # thread shuts the scheduler down (a decision, Ctrl-C, `orch cancel`) waits on
                # the lock that the shutdown holds while it waits on the check.
                if settled.is_set():
                    settled.clear()
                    scheduler.reschedule_job(RUN_CHECK, trigger="interval", seconds=pace.every_s)
        finally:
            self._abort_gone(attempt)
            self.keeper.stop_watching()
            scheduler.shutdown(wait=True)
            notices.stop()
            activity.stop()
        if first.failure is not None:
            raise first.failure
        assert first.decision is not None  # reached is set by a decision or a failure
        return first.decision

    def progress_clock(self, attempt: Attempt) -> ProgressClock:
        """The clock of rank 0's progress for a watch that starts now: a run this controller
        started is in its start; one it took over trains (its stall clock runs from now). A
        job that printed a step before is judged by its steps alone."""
        journal = self.journal
        steps = journal.last_step is not None or journal.job.step is not None
        return ProgressClock(time.monotonic(), steps=steps, starting=attempt.launch is not None)

    def _last_step(self) -> int | None:
        return self.journal.last_step

    def _guarded(self, check: Callable[[], Verdict | None], first: _First) -> Callable[[], None]:
        def run_check() -> None:
            if first.reached.is_set():
                return
            try:
                first.decide(check())
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                if first.reached.is_set():
                    # A check cut short by the decision (a pull from a node found gone) must
                    # not turn a recovery into a failure: the decision stands.
                    self.reporter.line(f"[orch] after the decision, a check failed: {exc}")
                    return
                first.fail(exc)

        return run_check

    def _abort_gone(self, attempt: Attempt) -> None:
        """Drop the connections of nodes found gone (lost, reclaimed, downed): a task still
        waiting on one (a checkpoint pull, a CPU reading) ends now rather than at the
        keepalive timeout, so the decision is acted on seconds sooner."""
        for rank in attempt.gone_ranks:
            self.keeper.node_gone(rank)  # a checkpoint transfer from it is killed too
            attempt.abort(rank)

    # --- the checks -------------------------------------------------------------------------
    def paced_check_run(self, attempt: Attempt, pace: RunPace) -> Verdict | None:
        """`check_run` when `pace` says a full check is due; else rank 0's new log lines only
        (`RunWatch.peek`), which decides nothing."""
        if pace.full_check_due(time.monotonic()):
            return self.check_run(attempt)
        watch = attempt.watch
        assert watch is not None  # set by `watch` before any check runs
        try:
            watch.peek()
        finally:
            self.journal.sample_progress()
        return None

    def _notice(self, attempt: Attempt, rank: int, notice: SpotNotice) -> Interruption:
        when = notice.time.isoformat() if notice.time else "an unstated time"
        return Interruption(
            (rank,), (attempt.instances[rank].instance_id,), "notice",
            f"spot interruption notice ({notice.action} at {when})", utcnow(), notice.time,
        )  # fmt: skip

    def check_run(self, attempt: Attempt) -> Verdict | None:
        """Liveness, the run's end and max_runtime. A node lost, reclaimed or downed is added
        to the attempt's gone ranks; a run that failed on a node raises `JobFailed` with the
        tail of that node's log."""
        watch = attempt.watch
        assert watch is not None  # set by `watch` before any check runs
        try:
            verdict = watch.tick()
        except NodeLost as lost:
            attempt.gone_ranks.add(lost.rank)
            ended = self._ended_by_orch(attempt, (lost.rank,)) or self.guards.ended_by_guard(
                (attempt.instances[lost.rank].instance_id,)
            )
            return ended or self._gone(attempt, (lost.rank,), str(lost.message))
        finally:
            self.journal.sample_progress()  # the progress this check read joins the history
        missing = tuple(rank for rank, misses in enumerate(watch.misses) if misses)
        if missing:
            # One missed probe is not a loss, unless the node's lease was closed by `orch down`
            # or the provider says it took the node.
            ended = self._ended_by_orch(attempt, missing)
            if ended is not None:
                attempt.gone_ranks.update(missing)
                return ended
            taken = self.provider.preempted(attempt.ids(missing))
            if taken:
                ranks = tuple(r for r in missing if attempt.instances[r].instance_id in taken)
                attempt.gone_ranks.update(ranks)
                return self._gone(attempt, ranks, "reclaimed by the provider")
        if verdict.done:
            if verdict.failed_rank is not None:
                if missing:
                    return None  # a peer stopped answering: wait until it is back or lost
                self._fail_with_tail(attempt, verdict.failed_rank, verdict.exit_code)
            return StopOrder(JobState.SUCCEEDED, 0, "")
        if not missing:
            progress = self.check_progress(attempt, watch)
            if progress is not None:
                return progress
        started = self.journal.job.started_at or utcnow()
        return runtime_order(
            elapsed_s=(utcnow() - started).total_seconds(),
            max_runtime_s=self.spec.budget.max_runtime,
        )

    def check_progress(self, attempt: Attempt, watch: RunWatch) -> Verdict | None:
        """Rank 0's progress against `recovery.start_timeout` and `budget.stall_timeout`
        (`node.run_progress`): a stall stops the job; a start that made no progress is a
        `FailedStart`, with what every node says of it."""
        spec = self.spec
        start_s, stall_s = spec.recovery.start_timeout, spec.budget.stall_timeout
        found = watch.clock.due(time.monotonic(), start_s, stall_s)
        if found is None:
            return None
        kind, _, seconds = found
        if kind == "stall":
            return stall_order(quiet_s=seconds, stall_timeout_s=stall_s, step=watch.clock.step)
        assert start_s is not None  # a start is only due with a timeout
        started = attempt.launch
        torchrun = started is not None and started.launcher == "torchrun"
        master = (started.master_addr, started.master_port) if started and torchrun else None
        reports = (
            start_reports(attempt.cluster, self.layout, master, skip=attempt.gone_ranks)
            if master is not None
            else {}
        )
        return hang_reason(
            reports,
            node_ips=[i.private_ip for i in attempt.instances],
            master=f"{master[0]}:{master[1]}" if master else None,
            procs_per_node=spec.resources.gpus_per_node,
            waited_s=seconds,
            start_timeout_s=start_s,
        )

    def check_activity(self, attempt: Attempt, activity: JobActivity) -> StopOrder | None:
        """Read every node's GPUs (or the job's CPU use) and stop the job once idle too long.

        A check of its own: a reading from a node that stopped answering can take as long as
        the connection's timeouts, and must not hold up the liveness checks of `check_run`.
        While a node misses checks it cannot be judged idle, so nothing is read then.
        """
        if attempt.watch is not None and any(attempt.watch.misses):
            return None
        return idle_order(
            idle_for_s=activity.tick(),
            idle_timeout_s=self.spec.budget.idle_timeout,
            what=activity.what,
        )

    def check_budget(self, attempt: Attempt) -> StopOrder | None:
        """Spend and hourly rate of the job's leases against its budget, then the monthly caps
        it is under (their spend this month projected at their total rate: every live job's
        nodes in them); while under them all, the nodes' guards get a fresh lease (the rest of
        each budget at the current rate)."""
        leases = self.journal.ledger.leases(self._job_id)
        horizon_s = self.options.budget_interval + self.options.stop_allowance
        order = budget_order(
            spend=total_cost(leases, utcnow()),
            hourly_rate=hourly_rate(leases),
            max_cost=self.spec.budget.max_cost_usd,
            max_hourly=self.spec.budget.max_hourly_usd,
            horizon_s=horizon_s,
        )
        if order is None and self.team is not None:
            order = self.team.stop_order(self.journal.job, horizon_s=horizon_s)
        budget = self.spec.budget
        if order is None and (
            budget.max_cost_usd is not None or budget.max_runtime or self.team is not None
        ):
            self.guards.renew(attempt)
        return order

    def _ended_by_orch(self, attempt: Attempt, ranks: tuple[int, ...]) -> StopOrder | None:
        """The stop for nodes that another orch command ended (`orch down`, which closes their
        leases): they were taken on purpose, so the job ends instead of launching new ones."""
        ids = set(attempt.ids(ranks))
        closed = sorted(
            lease.instance_id
            for lease in self.journal.ledger.leases(self._job_id)
            if lease.instance_id in ids and lease.ended_at is not None
        )
        if not closed:
            return None
        return StopOrder(
            JobState.CANCELLED,
            JobCancelled.exit_code,
            f"node(s) {', '.join(closed)} were shut down by another orch command (orch down)",
        )

    def _gone(self, attempt: Attempt, ranks: tuple[int, ...], detail: str) -> Interruption:
        """The interruption for nodes found gone, labelled by what the provider says."""
        ids = tuple(attempt.ids(ranks))
        taken = self.provider.preempted(list(ids))
        cause = "preempted" if taken else "lost"
        return Interruption(ranks, ids, cause, detail, utcnow())

    def _fail_with_tail(self, attempt: Attempt, rank: int, exit_code: int | None) -> None:
        layout = self.layout
        node = rank
        if exit_code == launch.SETUP_FAILED_EXIT:
            log = attempt.log_tail(rank, layout)
            reason = failure_report(rank, "the setup command failed", log)
        else:
            # Every node's log: the node whose workers failed first holds the cause, and its
            # torchrun may exit after the others', whose ranks lost a peer.
            logs = {n: attempt.log_tail(n, layout) for n in range(len(attempt.instances))}
            node, reason = cluster_failure(logs, rank, exit_code)
        raise JobFailed(reason, hint=f"full log: orch logs {self._job_id} --node {node}")
