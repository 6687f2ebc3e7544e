"""The job state machine: provision, sync, start, watch, pull checkpoints, tear down.

`JobRunner.run()` drives one job in the foreground and always ends in a final state with every
node terminated: teardown sits in a `finally` that no error path skips, and Ctrl-C during
teardown is held back until the nodes are gone. Every state change is written to the ledger
before the action it announces, so a killed controller leaves a trail to reconcile from.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from orchestrator import launch
from orchestrator.checkpoints import CheckpointMirror, listing_command, parse_listing
from orchestrator.cluster import Cluster
from orchestrator.config import Settings
from orchestrator.errors import JobCancelled, JobFailed, NodeUnreachable, OrchError
from orchestrator.ledger import CheckpointRecord, Job, JobState, Lease, Ledger, utcnow
from orchestrator.progress import (
    LineBuffer,
    Metrics,
    describe_event,
    local_rank_line,
    parse_metrics,
)
from orchestrator.providers.base import Instance, LaunchRequest, Provider
from orchestrator.remote.keys import ensure_identity
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.sync import (
    Transfer,
    pull_argv,
    pull_file_argv,
    push_argv,
    run_parallel,
    run_rsync,
)
from orchestrator.spec import LoadedJob


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

    watch_interval: float = 1.0  # how often nodes are probed
    lost_after: int = 3  # consecutive failed probes before a node counts as lost
    stop_grace: float = 60.0  # how long trainers get to checkpoint after SIGTERM on cancel
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    state: JobState
    exit_code: int
    reason: str | None


@dataclass(frozen=True)
class Verdict:
    """What the probes of one tick say about the run."""

    done: bool
    failed_rank: int | None = None
    exit_code: int | None = None


def assess(states: list[launch.NodeProbe]) -> Verdict:
    """Pure: finished when every node exited 0; failed as soon as one node exited non-zero."""
    for rank, probe in enumerate(states):
        if probe.state == "exited" and probe.exit_code != 0:
            return Verdict(True, rank, probe.exit_code)
    if all(p.state == "exited" for p in states):
        return Verdict(True)
    return Verdict(False)


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
    """Runs one job in the foreground, start to finish. Build it, then call `run()` once."""

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
        state, exit_code, reason = JobState.FAILED, 1, None
        try:
            self._provision()
            self._sync()
            self._start()
            self._watch()
            state, exit_code = JobState.SUCCEEDED, 0
        except KeyboardInterrupt:
            state, exit_code, reason = JobState.CANCELLED, JobCancelled.exit_code, "cancelled"
        except OrchError as exc:
            state, exit_code, reason = JobState.FAILED, exc.exit_code, str(exc)
        except Exception as exc:
            state, exit_code, reason = JobState.FAILED, 1, f"internal error: {exc!r}"
            raise
        finally:
            with interrupts_deferred():
                self._teardown(state, exit_code, reason)
        return JobOutcome(self.job.id, state, exit_code, reason)

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
            spot=resources.spot is True,
            accelerator=resources.accelerator,
            max_price_per_hour=resources.max_price_per_hour,
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

    def _watch(self) -> None:
        assert self.cluster is not None
        buffer = LineBuffer()
        offset = 0
        misses = [0] * len(self.instances)
        log_copy = self.job_dir / "logs" / "node-0.log"
        log_copy.parent.mkdir(parents=True, exist_ok=True)
        pull_every = self.spec.checkpoint.pull_every
        next_pull = time.monotonic() + pull_every
        with log_copy.open("a", encoding="utf-8") as log_file:
            while True:
                probes = self._probe_all(offset, misses)
                head = probes[0]
                if head.new_log:
                    offset += len(head.new_log.encode())
                    log_file.write(head.new_log)
                    log_file.flush()
                    self._show(buffer.feed(head.new_log))
                verdict = assess(probes)
                if verdict.done:
                    self._show(buffer.flush())
                    if verdict.failed_rank is not None:
                        self._fail_with_tail(verdict.failed_rank, verdict.exit_code)
                    return
                if time.monotonic() >= next_pull:
                    self._pull_checkpoints(final=False)
                    next_pull = time.monotonic() + pull_every
                time.sleep(self.options.watch_interval)

    def _probe_all(self, offset: int, misses: list[int]) -> list[launch.NodeProbe]:
        assert self.cluster is not None

        def probe(rank: int, connection: NodeConnection) -> launch.NodeProbe:
            command = launch.probe_command(self.layout, offset if rank == 0 else None)
            try:
                result = connection.run(command, timeout=30, check=False)
            except NodeUnreachable:
                return launch.NodeProbe("unreachable", None, 0, "")
            return launch.parse_probe(result.stdout)

        probes = self.cluster.map(probe)
        for rank, probe_result in enumerate(probes):
            lost = probe_result.state in ("unreachable", "vanished", "not-started")
            misses[rank] = misses[rank] + 1 if lost else 0
            if misses[rank] >= self.options.lost_after:
                raise JobFailed(
                    f"node {rank} ({self.instances[rank].instance_id}) was lost: "
                    f"{probe_result.state} on {misses[rank]} consecutive checks",
                    hint="see `orch logs " + self.job.id + f" --rank {rank}`",
                )
        return probes

    def _show(self, lines: list[str]) -> None:
        for line in lines:
            local_rank, text = local_rank_line(line)
            if local_rank is None:
                if text.startswith("[orch]"):
                    self.reporter.line(text)
                continue
            if local_rank != 0:
                continue
            metrics = parse_metrics(text)
            if metrics is None:
                self.reporter.line(describe_event(text) or text)
                continue
            self.reporter.metrics(metrics)
            self._record_step(metrics.step)

    def _record_step(self, step: int) -> None:
        self._last_step = step
        now = time.monotonic()
        if now - self._last_step_saved >= 2.0:
            self.ledger.update_job(self.job.id, step=step)
            self._last_step_saved = now

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
        checkpoint_dir = self.layout.node_path(self.spec.checkpoint.dir)
        head = self.cluster.head
        try:
            listing = parse_listing(
                head.run(
                    listing_command(launch.home_expr(checkpoint_dir)), timeout=60, check=False
                ).stdout
            )
        except NodeUnreachable:
            return

        def fetch(files_from: Path, staging: Path) -> None:
            assert self.cluster is not None
            argv = pull_argv(
                self.cluster.addresses[0],
                self.cluster.identity,
                checkpoint_dir,
                staging,
                files_from=files_from,
            )
            run_rsync(argv, what="checkpoint pull", timeout=3600)

        for pulled in self.mirror.pull(listing, fetch, final=final):
            if pulled.name == "latest":
                continue  # the trainer's pointer to its newest checkpoint, not one itself
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
        logs_dir = self.job_dir / "logs"
        transfers = [
            Transfer(
                f"log of {address.name}",
                pull_file_argv(
                    address, self.cluster.identity, self.layout.log, logs_dir / f"node-{rank}.log"
                ),
            )
            for rank, address in enumerate(self.cluster.addresses)
        ]
        run_parallel(transfers, timeout=300)

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
    def _teardown(self, state: JobState, exit_code: int, reason: str | None) -> None:
        """Salvage what can be salvaged, then end every node of the job and close its leases."""
        self.ledger.update_job(self.job.id, state=JobState.STOPPING)
        self.reporter.phase("stopping: pulling checkpoints and logs, shutting nodes down")
        if self.cluster is not None and self._started:
            if state is not JobState.SUCCEEDED:
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
            state=state,
            ended_at=ended_at,
            exit_code=exit_code,
            reason=reason,
            step=self._last_step if self._last_step is not None else self.job.step,
        )
        self.ledger.add_event(self.job.id, state.value, reason or "", step=self._last_step)
        self.reporter.phase(state.value.lower())

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


def controller_identity() -> str:
    """Who runs a job's controller (host:pid), recorded so `reconcile` can tell if it lives."""
    return f"{os.uname().nodename}:{os.getpid()}"


def new_job_id(name: str) -> str:
    return f"{name}-{os.urandom(3).hex()}"


def register_job(ledger: Ledger, loaded: LoadedJob, provider_name: str) -> Job:
    """Write the job to the ledger (state PENDING) before anything is provisioned."""
    spec = loaded.spec
    return ledger.add_job(
        Job(
            id=new_job_id(spec.name),
            name=spec.name,
            state=JobState.PENDING,
            provider=provider_name,
            nodes=spec.resources.nodes,
            gpus_per_node=spec.resources.gpus_per_node,
            spec_json=spec.model_dump_json(),
            spec_path=str(loaded.source),
            created_at=utcnow(),
            controller=controller_identity(),
        )
    )
