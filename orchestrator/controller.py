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
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from orchestrator import launch
from orchestrator.activity import ActivityThresholds, JobActivity
from orchestrator.checkpoints import CheckpointMirror
from orchestrator.cluster import Cluster
from orchestrator.config import Settings
from orchestrator.errors import JobCancelled, JobFailed, OrchError
from orchestrator.ledger import (
    CheckpointRecord,
    Job,
    JobState,
    Lease,
    Ledger,
    total_cost,
    utcnow,
)
from orchestrator.policies import StopOrder, budget_order, idle_order, runtime_order
from orchestrator.progress import Metrics
from orchestrator.providers.base import Instance, LaunchRequest, Provider
from orchestrator.pulls import pull_checkpoints, pull_logs
from orchestrator.remote.keys import ensure_identity
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import Transfer, push_argv, run_parallel
from orchestrator.spec import LoadedJob
from orchestrator.supervision import controller_identity
from orchestrator.watch import RunWatch


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
    stop_grace: float = 60.0  # how long trainers get to checkpoint after SIGTERM
    connect_timeout: float = 10.0
    idle_util_pct: float = 5.0  # GPU utilization below which a GPU is idle
    idle_cpu_pct: float = 10.0  # without GPUs: job CPU (% of one core) below which it is idle
    gpu_sample_every: float = 30.0  # the ledger keeps one averaged GPU sample per window


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
        self.cluster: Cluster | None = None
        self.instances: list[Instance] = []
        self._started = False
        self._last_step: int | None = None
        self._last_step_saved = 0.0

    # --- the whole run ----------------------------------------------------------------------
    def run(self) -> JobOutcome:
        """Drive the job from its recorded state to a final one; always tears down.

        PENDING starts from scratch. A job found RUNNING is adopted (its training never
        stopped); one found PROVISIONING or SYNCING is started again on fresh nodes (nothing
        ran yet); one found STOPPING finishes its stop.
        """
        order = StopOrder(JobState.FAILED, 1, "")
        try:
            if self.job.state == JobState.STOPPING and self.job.stop_state:
                order = StopOrder(
                    JobState(self.job.stop_state), self.job.exit_code or 1, self.job.reason or ""
                )
                self._adopt(require_all=False)
                return self._outcome(order)
            if self.job.state == JobState.RUNNING:
                self._adopt(require_all=True)
            else:
                if self.job.state != JobState.PENDING:
                    self._restart_from_scratch()
                self._provision()
                self._sync()
                self._start()
            order = self._supervise()
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
            spot=resources.spot,
            accelerator=resources.accelerator,
            max_price_per_hour=resources.max_price_per_hour,
            min_gpu_memory_gb=resources.min_gpu_memory_gb,
            attempt=self.job.recoveries,
        )
        self.instances = self.provider.launch(request)
        for instance in self.instances:
            self.ledger.open_lease(
                Lease(
                    job_id=self.job.id,
                    cluster=instance.cluster,
                    provider=self.provider.name,
                    instance_id=instance.instance_id,
                    rank=instance.rank,
                    market=instance.market,
                    instance_type=instance.instance_type,
                    price_per_hour=instance.price_per_hour,
                    launched_at=instance.launched_at,
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
            user_env=dict(self.spec.env),
        )

        pids = start_on_nodes(self.cluster, cluster_launch)
        self._started = True
        self._set_state(
            JobState.RUNNING,
            f"torchrun on {len(pids)} node(s), master {cluster_launch.master_addr}:{port}",
            started_at=utcnow(),
        )

    # --- supervision: APScheduler runs the periodic work, the main thread waits --------------
    def _supervise(self) -> StopOrder:
        """Watch until the run ends or a policy stops it; returns how the job ends.

        Each periodic task runs in the scheduler's threads; the first one that reaches a
        decision (or fails) sets it and wakes the main thread, which is the only thread that
        ever tears down. Ctrl-C lands in the main thread as KeyboardInterrupt.
        """
        assert self.cluster is not None
        self._watch = RunWatch(
            self.cluster,
            self.layout,
            self.job_dir / "logs",
            on_metrics=self._record_metrics,
            on_line=self.reporter.line,
            lost_after=self.options.lost_after,
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
        self._decision: StopOrder | None = None
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
            self._guarded(self._tick_budget), "interval",
            seconds=self.options.budget_interval, next_run_time=now,
        )  # fmt: skip
        scheduler.add_job(
            self._guarded(lambda: self._pull_checkpoints(final=False)), "interval",
            seconds=self.spec.checkpoint.pull_every,
        )  # fmt: skip
        scheduler.start()
        try:
            while not self._decided.wait(0.2):
                pass
        finally:
            scheduler.shutdown(wait=True)
            self._activity.stop()
        if self._failure is not None:
            raise self._failure
        assert self._decision is not None
        return self._decision

    def _guarded(self, task: Callable[[], None]) -> Callable[[], None]:
        def run_task() -> None:
            if self._decided.is_set():
                return
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                self._failure = exc
                self._decided.set()

        return run_task

    def _decide(self, order: StopOrder) -> None:
        if not self._decided.is_set():
            self._decision = order
            self._decided.set()

    def _tick_watch(self) -> None:
        verdict = self._watch.tick()
        if verdict.done:
            if verdict.failed_rank is not None:
                self._fail_with_tail(verdict.failed_rank, verdict.exit_code)
            self._decide(StopOrder(JobState.SUCCEEDED, 0, ""))
            return
        started = self.job.started_at or utcnow()
        idle_for = self._activity.tick()
        order = runtime_order(
            elapsed_s=(utcnow() - started).total_seconds(),
            max_runtime_s=self.spec.budget.max_runtime,
        ) or idle_order(
            idle_for_s=idle_for,
            idle_timeout_s=self.spec.budget.idle_timeout,
            what=self._activity.what,
        )
        if order is not None:
            self._decide(order)

    def _tick_budget(self) -> None:
        leases = self.ledger.leases(self.job.id)
        hourly = sum(
            (lease.price_per_hour for lease in leases if lease.ended_at is None), Decimal(0)
        )
        order = budget_order(
            spend=total_cost(leases, utcnow()),
            hourly_rate=hourly,
            max_cost=self.spec.budget.max_cost_usd,
            max_hourly=self.spec.budget.max_hourly_usd,
            horizon_s=self.options.budget_interval + self.options.stop_allowance,
        )
        if order is not None:
            self._decide(order)

    def _record_metrics(self, metrics: Metrics) -> None:
        self.reporter.metrics(metrics)
        self._last_step = metrics.step
        now = time.monotonic()
        if now - self._last_step_saved >= 2.0:
            fields: dict[str, object] = {"step": metrics.step}
            if metrics.loss is not None:
                fields["loss"] = metrics.loss
            self.ledger.update_job(self.job.id, **fields)
            self._last_step_saved = now

    # --- adoption -------------------------------------------------------------------------------
    def _adopt(self, *, require_all: bool) -> None:
        """Take over the job's running nodes after a controller died; training goes on."""
        instances = self.provider.list_owned(job_id=self.job.id)
        recorded = {lease.instance_id for lease in self.ledger.leases(self.job.id, open_only=True)}
        if require_all and (not instances or {i.instance_id for i in instances} != recorded):
            raise JobFailed(
                f"the job's nodes changed while it had no controller: recorded {sorted(recorded)}, "
                f"running {sorted(i.instance_id for i in instances)}",
                hint="the job is stopped; submit it again (it resumes from its last checkpoint)",
            )
        self.instances = sorted(instances, key=lambda i: i.rank)
        if not self.instances:
            return
        identity = ensure_identity(self.settings.keys_dir(self.job.id), f"orch-{self.job.id}")
        self.cluster = Cluster(
            self.instances, identity, connect_timeout=self.options.connect_timeout
        )
        self._started = True
        self._last_step = self.job.step
        self.ledger.add_event(
            self.job.id, "ADOPTED", f"controller {controller_identity()} took over "
            f"{len(self.instances)} node(s)", step=self.job.step,
        )  # fmt: skip
        self.reporter.phase(f"adopted by controller {controller_identity()}")

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

    # --- checkpoints and logs --------------------------------------------------------------
    def _pull_checkpoints(self, *, final: bool) -> None:
        assert self.cluster is not None
        for pulled in pull_checkpoints(
            self.cluster, self.mirror, self.layout.node_path(self.spec.checkpoint.dir), final=final
        ):
            self.ledger.add_checkpoint(
                CheckpointRecord(
                    job_id=self.job.id,
                    name=pulled.name,
                    step=pulled.step,
                    size_bytes=pulled.size_bytes,
                    pulled_at=utcnow(),
                )
            )
            self.ledger.add_event(
                self.job.id, "CHECKPOINT", f"pulled {pulled.name}", step=pulled.step
            )
            self.reporter.line(f"[orch] checkpoint pulled: {pulled.name}")

    def _pull_logs(self) -> None:
        assert self.cluster is not None
        pull_logs(self.cluster, self.layout, self.job_dir / "logs")

    def _stop_trainers(self) -> None:
        """SIGTERM the run on every node and wait (bounded) for it to checkpoint and exit."""
        assert self.cluster is not None

        def stop(rank: int, connection: NodeConnection) -> None:
            connection.run(launch.stop_command(self.layout), timeout=15, check=False)

        with contextlib.suppress(OrchError):
            self.cluster.map(stop)

        def probe(rank: int, connection: NodeConnection) -> launch.NodeProbe:
            command = launch.probe_command(self.layout, None)
            return launch.parse_probe(connection.run(command, timeout=15, check=False).stdout)

        deadline = time.monotonic() + self.options.stop_grace
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
        controller that adopts a half-finished stop knows how the job must end.
        """
        reason = order.reason or None
        self.ledger.update_job(
            self.job.id,
            state=JobState.STOPPING,
            stop_state=order.state.value,
            exit_code=order.exit_code,
            reason=reason,
        )
        self.ledger.add_event(
            self.job.id, "STOPPING", f"{order.state.value}: {reason or 'finished'}",
            step=self._last_step,
        )  # fmt: skip
        self.reporter.phase(
            f"stopping ({order.state.value}): pulling checkpoints and logs, shutting nodes down"
        )
        if self.cluster is not None and self._started:
            if order.state is not JobState.SUCCEEDED:
                self._stop_trainers()
            for salvage in (lambda: self._pull_checkpoints(final=True), self._pull_logs):
                try:
                    salvage()
                except OrchError as exc:
                    self.ledger.add_event(self.job.id, "WARNING", f"during teardown: {exc}")
        ended_at = self._terminate_all()
        if self.cluster is not None:
            self.cluster.close()
        self.ledger.update_job(
            self.job.id,
            state=order.state,
            ended_at=ended_at,
            exit_code=order.exit_code,
            reason=reason,
            step=self._last_step if self._last_step is not None else self.job.step,
        )
        self.ledger.add_event(self.job.id, order.state.value, reason or "", step=self._last_step)
        self.reporter.phase(order.state.value.lower())

    def _terminate_all(self) -> datetime:
        """Terminate the recorded nodes and anything else the provider runs for this job."""
        ids = {i.instance_id for i in self.instances}
        ids |= {lease.instance_id for lease in self.ledger.leases(self.job.id, open_only=True)}
        try:
            ids |= {i.instance_id for i in self.provider.list_owned(job_id=self.job.id)}
        except OrchError as exc:
            self.ledger.add_event(self.job.id, "WARNING", f"could not list nodes: {exc}")
        if not ids:
            return utcnow()
        ended_at = self.provider.terminate(sorted(ids))
        self.ledger.close_leases(ids, ended_at)
        self.ledger.add_event(self.job.id, "TERMINATED", f"{len(ids)} node(s)")
        return ended_at


def start_on_nodes(cluster: Cluster, cluster_launch: launch.ClusterLaunch) -> list[str]:
    """Write each node's launch script and start it detached; returns the pids, by rank.

    Refuses (RemoteError) to start a node whose run was already started.
    """
    layout = cluster_launch.layout

    def start(rank: int, connection: NodeConnection) -> str:
        node = launch.NodeLaunch(rank, cluster.instances[rank].interface)
        script = launch.launch_script(cluster_launch, node)
        connection.run(
            launch.write_file_command(f"{layout.run_dir}/launch.sh", "0755"), stdin=script
        )
        return connection.run(launch.start_command(layout)).stdout.strip()

    return cluster.map(start)
