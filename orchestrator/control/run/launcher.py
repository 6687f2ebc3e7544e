"""Bringing a run up on nodes: launch them (leases first), copy the job over, start it; or
take over the nodes of a run another controller started."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.cluster.checkpoints.kept_summary import describe_kept
from orchestrator.cluster.steps import node_step
from orchestrator.config import Settings
from orchestrator.control.process.controllers import controller_identity
from orchestrator.control.process.ownership import check_identity
from orchestrator.control.run.attempt import Attempt, AttemptOpener
from orchestrator.control.run.current_attempt import CurrentAttempt
from orchestrator.control.run.data_step import DataStep
from orchestrator.control.run.fleet_turn import FleetTurn
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.image_step import have_image
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter, RunnerOptions
from orchestrator.control.run.recovery_rules import backoff_seconds
from orchestrator.control.run.replacing import joined, lost_ranks, replacement_request
from orchestrator.errors import CapacityError, IdentityMismatch, OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, utcnow
from orchestrator.node import launch
from orchestrator.node.clear_protocol import fresh_command
from orchestrator.node.container import ContainerJob
from orchestrator.providers.base import Instance, LaunchRequest, Provider
from orchestrator.providers.requests import launch_request
from orchestrator.remote.keys import Identity, ensure_identity
from orchestrator.spec.model import JobSpec, LoadedJob
from orchestrator.spot.driver import DeadlineDriver

SYNC_HINT = (
    "the lines above say what rsync met: a workdir or data file that cannot be read here, or a "
    "node whose disk is full or that lacks rsync; fix it (or leave the file out with "
    ".orchignore) and submit again"
)
START_HINT = (
    "the nodes need bash and python3 (3.8 or newer) on their PATH, a writable home and free "
    "disk; the lines above say what failed: fix the node image (or `setup`) and submit again"
)


class Launcher:
    """Makes the attempts of one job. Billing starts with `provision`'s launch; nothing here
    ends a node (the runner does, whatever fails here): every node launched is held in
    `current` (the job's current attempt) the moment it exists, before its lease is written."""

    def __init__(
        self,
        *,
        journal: Journal,
        loaded: LoadedJob,
        layout: launch.NodeLayout,
        settings: Settings,
        options: RunnerOptions,
        provider: Provider,
        reporter: Reporter,
        keeper: CheckpointKeeper,
        guards: Guards,
        driver: DeadlineDriver | None,
        open_attempt: AttemptOpener,
        current: CurrentAttempt,
    ) -> None:
        """`driver`: the spot policy, which picks each launch's market (None: the spec's)."""
        self.journal = journal
        self.loaded = loaded
        self.spec = loaded.spec
        self.layout = layout
        self.settings = settings
        self.options = options
        self.provider = provider
        self.reporter = reporter
        self.keeper = keeper
        self.guards = guards
        self.driver = driver
        self.open_attempt = open_attempt
        self.current = current
        self.setup_key: str | None = None  # on a kept cluster: `setup` runs only when it changed
        self.data = DataStep(
            journal=journal, reporter=reporter, loaded=loaded, settings=settings, options=options
        )

    def claim_identity(self) -> None:
        """Refuse a job whose nodes were launched as another cloud identity (`IdentityMismatch`,
        also written as a REFUSED event); record the provider's on a job that has none yet.

        When the cloud cannot say who this is, a job with a recorded identity is refused too
        (the error as is): nothing may be touched that cannot be seen.
        """
        job, ledger = self.journal.job, self.journal.ledger
        recorded = [job.identity]
        recorded += [lease.identity for lease in ledger.leases(job.id, open_only=True)]
        try:
            current = self.provider.identity()
        except OrchError:
            if any(text is not None for text in recorded):
                raise
            return  # nothing recorded to protect: a launch says what is wrong
        try:
            check_identity(job.id, recorded, current)
        except IdentityMismatch as exc:
            last = ledger.events(job.id)[-1:]
            if not last or (last[0].kind, last[0].message) != ("REFUSED", str(exc)):
                self.journal.event("REFUSED", str(exc), step=job.step)
            raise
        if job.identity is None:
            self.journal.identity(current.to_json())

    def _identity(self) -> Identity:
        owner = self.journal.job.node_owner
        return ensure_identity(self.settings.keys_dir(owner), f"orch-{owner}")

    def provision(self, *, avoid_zones: tuple[str, ...], pull_wait: float) -> Attempt:
        """PROVISIONING, then launch the job's nodes and open their leases; returns the
        attempt connected to them, held in `current` (as the nodes are, as soon as they are
        launched, before their leases are written)."""
        job = self.journal.job
        resources = self.spec.resources
        identity = self._identity()
        self.journal.provisioning(
            f"{resources.nodes} node(s) x {resources.gpus_per_node} on {self.provider.name}"
        )
        request = launch_request(
            self.spec,
            job.node_owner,
            public_key=identity.public_key,
            spot=self.driver.launch_spot if self.driver is not None else None,
            avoid_zones=avoid_zones,
            zones=self.driver.launch_zones if self.driver is not None else None,
            guard=self.guards.terms(pull_wait),
            ledger_id=self.journal.ledger.ledger_id,
            attempt=self._launch_number(),
        )
        instances = self._launch(request)
        self.current.hold(Attempt(instances))
        for instance in instances:
            self.journal.leased(instance, provider=self.provider.name)
        attempt = self.open_attempt(instances, identity, self.options.connect_timeout)
        self.current.hold(attempt)
        return attempt

    def replace_lost(self, survivors: list[Instance], *, pull_wait: float) -> Attempt:
        """PROVISIONING, then launch one node per rank the `survivors` lack, in their zone,
        type and market (`replacing.replacement_request`), and open their leases; returns the
        attempt connected to survivors and replacements. The survivors' leases stay open (they
        never stopped billing). Raises `CapacityError` when the zone refuses the replacements
        (after the launch's bounded retries); `current` holds every node as soon as there is
        one to end, as in `provision`. With no rank lacking (a restart on the same nodes), nothing
        is launched."""
        nodes = self.spec.resources.nodes
        if not lost_ranks(survivors, nodes):
            self.journal.provisioning(f"no node to launch: the run restarts on its {nodes} node(s)")
            return self.join_replacements(survivors, [])
        self.journal.provisioning(_replacing(survivors, nodes))
        replacements = self._launch_replacements(
            survivors, pull_wait, lambda nodes: self.current.hold(Attempt([*survivors, *nodes]))
        )
        return self.join_replacements(survivors, replacements)

    def launch_early(
        self,
        survivors: list[Instance],
        *,
        pull_wait: float,
        launched: Callable[[list[Instance]], None],
    ) -> list[Instance]:
        """Launch the replacements for the ranks the `survivors` lack while the job still runs
        on the node they replace (a notice: see `early_replacement`), and open their leases.
        Writes a PROVISIONING event, not the state: the job stays RUNNING until the salvage
        is done. `launched` gets the nodes the moment they exist (they are not the current
        attempt's). Raises `CapacityError` when the zone refuses them."""
        self.journal.event(
            JobState.PROVISIONING.value,
            _replacing(survivors, self.spec.resources.nodes) + ", launched at the notice",
        )
        return self._launch_replacements(survivors, pull_wait, launched)

    def copy_to(self, instances: list[Instance]) -> None:
        """Copy the workdir and the data to `instances` (nodes launched early, not yet part
        of the run), over connections of their own, under `nice`: the salvage beside it (the
        emergency checkpoint, its pull) goes first."""
        attempt = self.open_attempt(instances, self._identity(), self.options.connect_timeout)
        try:
            attempt.push(self.loaded, self.layout, low_priority=True,
                         timeout=self.options.push_timeout)  # fmt: skip
            self.data.bring(attempt, low_priority=True)
        finally:
            attempt.close()

    def join_replacements(
        self,
        survivors: list[Instance],
        replacements: list[Instance],
        *,
        early: bool = False,
    ) -> Attempt:
        """The attempt connected to `survivors` and their `replacements` (launched, leases
        open), held in `current`; with `early` (launched at the notice), PROVISIONING is
        written first, for the state's sake: nothing is launched then."""
        if early:
            self.journal.provisioning(
                _replacing(survivors, self.spec.resources.nodes) + ", launched at the notice: "
                + ", ".join(i.instance_id for i in replacements)
            )  # fmt: skip
        self.current.hold(Attempt([*survivors, *replacements]))
        nodes = joined(survivors, replacements)
        attempt = self.open_attempt(nodes, self._identity(), self.options.connect_timeout)
        attempt.stayed = frozenset(i.rank for i in survivors)
        self.current.hold(attempt)
        return attempt

    def _launch_replacements(
        self,
        survivors: list[Instance],
        pull_wait: float,
        launched: Callable[[list[Instance]], None],
    ) -> list[Instance]:
        """Launch one node per rank the `survivors` lack, in their zone, type and market, and
        open their leases (`launched` gets them first). The PROVISIONING event is written."""
        job = self.journal.job
        identity = self._identity()
        request = replacement_request(
            launch_request(
                self.spec,
                job.node_owner,
                public_key=identity.public_key,
                guard=self.guards.terms(pull_wait, beside=survivors),
                ledger_id=self.journal.ledger.ledger_id,
                attempt=self._launch_number(),  # counts the PROVISIONING event just written
            ),
            survivors,
        )
        # One retry at most: the survivors bill while they wait, and a whole cluster elsewhere
        # is the better bet once the zone has refused twice.
        replacements = self._launch(request, retries=min(1, self.options.launch_retries))
        launched(replacements)
        for instance in replacements:
            self.journal.leased(instance, provider=self.provider.name)
        return replacements

    def reopen(self, instances: list[Instance]) -> Attempt:
        """An attempt connected to nodes that are already up (a kept cluster's)."""
        attempt = self.open_attempt(instances, self._identity(), self.options.connect_timeout)
        attempt.stayed = frozenset(i.rank for i in instances)
        return attempt

    def _launch_number(self) -> int:
        """The number of the launch about to be made, 0 first: one per PROVISIONING event (each
        launch writes one first), whoever made them. So a controller that starts a job again
        after another died never repeats the idempotency tokens of that one's launch (EC2 would
        answer with the old, terminated instances, or refuse the new user data)."""
        kind = JobState.PROVISIONING.value
        events = self.journal.ledger.events(self.journal.job.id)
        return max(0, sum(1 for e in events if e.kind == kind) - 1)

    def _launch(self, request: LaunchRequest, retries: int | None = None) -> list[Instance]:
        """Launch the nodes; spot-only launches refused for capacity are retried with backoff,
        `retries` times (None: the options' `launch_retries`). On a fleet, a launch with no
        room waits in the fleet's queue (`FleetTurn`)."""
        if request.fleet is not None:
            owner = self.journal.job.owner or self.settings.owner_label
            turn = FleetTurn(self.journal, self.reporter, owner=owner)
            return turn.launch(request, self.provider.launch)
        retries = self.options.launch_retries if retries is None else retries
        attempt = 0
        while True:
            try:
                return self.provider.launch(request)
            except CapacityError as exc:
                if request.spot is not True or self.driver is not None:
                    raise  # a spot policy decides again instead of retrying
                if attempt >= retries:
                    raise CapacityError(
                        f"spot capacity was refused {attempt + 1} time(s) in a row; last "
                        f"answer: {exc.message}",
                        hint="set resources.spot to auto (falls back on on-demand) or retry later",
                    ) from exc
                attempt += 1
                wait = backoff_seconds(attempt, self.options.launch_backoff)
                self.journal.event(
                    "WAITING", f"spot launch refused ({exc.message}); retry "
                    f"{attempt} of {retries} in {wait:.0f} s",
                )  # fmt: skip
                self.reporter.phase(f"no spot capacity; retrying in {wait:.0f} s")
                time.sleep(wait)

    def sync(self, attempt: Attempt) -> None:
        """SYNCING, then copy the workdir to every node and bring the data (`DataStep.bring`);
        a transfer not done within the options' `push_timeout` is stopped
        (`TransferTimeout`)."""
        spec = self.spec
        self.journal.syncing(f"workdir and {len(spec.data)} data path(s)")
        started = time.monotonic()
        with node_step("sync of the workdir to the nodes", SYNC_HINT):
            transfers = attempt.push(self.loaded, self.layout, timeout=self.options.push_timeout)
        with node_step("transfer of the data to the nodes", SYNC_HINT):
            self.data.bring(attempt, stayed=attempt.stayed)
        seconds = time.monotonic() - started
        self.journal.event("SYNCED", f"{transfers} transfer(s), {seconds:.1f} s")
        if self.loaded.left_out and self.journal.job.started_at is None:
            # Before the first start no node holds a file of the run's own: a copy of a left
            # out file there came from an earlier job's sync (a kept cluster) and goes too.
            command = fresh_command(self.layout, self.loaded.left_out)
            with node_step("removal of the files --fresh leaves out from the nodes", SYNC_HINT):
                attempt.cluster.map(lambda rank, c: c.run(command, timeout=120))

    def start(self, attempt: Attempt) -> None:
        """Start the run (from the newest checkpoint), then RUNNING.

        Before the start, four things that need no other's result run at once, each one SSH
        command per node or a few: the job's container image on every node (a pull, shown as
        it goes), a free port on node 0, the checkpoint agents (sent, the
        newest checkpoint put back, on a restart the newer steps the nodes hold set aside,
        armed), and the guards (checked, then given the lease with the run's deadline). The
        guards' lease is written before the run starts and never after it: its runtime
        deadline counts from a moment before the start, so it is never later than the
        controller's own."""
        with ThreadPoolExecutor(4, thread_name_prefix="orch-prestart") as pool:
            image_asked = pool.submit(
                have_image, attempt.cluster, self.spec, self.layout, self.journal, self.reporter
            )
            port_asked = pool.submit(self._free_port, attempt)
            resume_asked = pool.submit(
                self.keeper.prepare, attempt.cluster, restart=self.journal.job.recoveries > 0,
                **attempt.node_access(),
            )  # fmt: skip
            guards_asked = pool.submit(self._arm_guards, attempt)
            image_asked.result()
            port, resume = port_asked.result(), resume_asked.result()
            guards_asked.result()
        resume_from, resume_step = resume.path, resume.step
        cluster_launch = launch_plan(
            self.spec, self.journal.job, self.layout, attempt.instances, port, resume_from,
            self.setup_key,
        )  # fmt: skip
        with node_step("start of the run on the nodes", START_HINT):
            pids = attempt.start(cluster_launch)
        self.journal.await_progress()
        if self.driver is not None:
            self.driver.new_run()
        job = self.journal.job
        self.journal.running(
            f"torchrun on {len(pids)} node(s), master {cluster_launch.master_addr}:{port}",
            started_at=job.started_at or utcnow(),
        )
        if self.journal.job.recoveries or resume_from:
            self.journal.event("RESUMED", self._resumed_from(resume_from), step=resume_step)

    def _resumed_from(self, resume_from: str) -> str:
        """The RESUMED event's text: the directory resumed, else the single files put back
        (each with its step and age), else that there was none."""
        if resume_from:
            return f"from {resume_from}"
        files = [k for k in self.keeper.kept() if not k.directory]
        if not files:
            return "with no checkpoint put back: orch holds none of this job"
        return f"from the checkpoint files put back: {describe_kept(files, utcnow())}"

    def _free_port(self, attempt: Attempt) -> int:
        with node_step("search for a free port on node 0 (torchrun's rendezvous)", START_HINT):
            return attempt.free_port()

    def _arm_guards(self, attempt: Attempt) -> None:
        with node_step("arming of the node guards", START_HINT):
            self.guards.check(attempt)
            self.guards.renew(attempt)  # heard from, and the run's own deadline

    def adopt(self, instances: list[Instance]) -> Attempt:
        """Take over `instances`, on which another controller started the run; it goes on."""
        job = self.journal.job
        attempt = self.open_attempt(instances, self._identity(), self.options.connect_timeout)
        attempt.started = True
        try:
            self.keeper.adopt(attempt.cluster, **attempt.node_access())
        except OrchError as exc:
            self.journal.event("WARNING", f"checkpoint agents: {exc}")
        self.journal.event(
            "ADOPTED", f"controller {controller_identity()} took over "
            f"{len(instances)} node(s)", step=job.step,
        )  # fmt: skip
        self.reporter.phase(f"adopted by controller {controller_identity()}")
        return attempt


def _replacing(survivors: list[Instance], nodes: int) -> str:
    """What a replacement launch is, for its PROVISIONING line."""
    first = survivors[0]
    ranks = lost_ranks(survivors, nodes)
    where = f" in {first.zone}" if first.zone else ""
    return (
        f"{len(ranks)} replacement node(s) for rank(s) {', '.join(map(str, ranks))} "
        f"beside {len(survivors)} that stay, {first.instance_type} {first.market}{where}"
    )


def launch_plan(
    spec: JobSpec,
    job: Job,
    layout: launch.NodeLayout,
    instances: list[Instance],
    port: int,
    resume_from: str,
    setup_key: str | None = None,
) -> launch.ClusterLaunch:
    """How the run is started on `instances`, its rendezvous on node 0's `port`."""
    return launch.ClusterLaunch(
        job_id=job.id,
        node_owner=job.node_owner,
        run=spec.run,
        setup=spec.setup,
        num_nodes=len(instances),
        procs_per_node=spec.resources.gpus_per_node,
        master_addr=instances[0].private_ip,
        master_port=port,
        node_ips=[i.private_ip for i in instances],
        checkpoint_dir=layout.node_path(spec.checkpoint.dir),
        resume_from=resume_from,
        user_env={**spec.env, **spec.secrets},
        launcher=spec.launcher,
        setup_key=setup_key,
        container=container_job(spec, layout, resume_from),
    )


def container_job(
    spec: JobSpec, layout: launch.NodeLayout, resume_from: str
) -> ContainerJob | None:
    """The spec's container for one start: the job's paths to mount (data destinations, the
    checkpoint directory and what is resumed from, beside the job's own directory)."""
    container = spec.container
    if container is None:
        return None
    mounts = [launch.home_relative(mount.dst) for mount in spec.data]
    mounts.append(layout.node_path(spec.checkpoint.dir))
    if resume_from:
        mounts.append(posixpath.dirname(resume_from) or resume_from)
    return ContainerJob(
        image=container.image,
        mounts=tuple(dict.fromkeys(mounts)),
        shm_size=container.shm_size,
        devices=tuple(container.devices),
        volumes=tuple(container.volumes),
        start=int(time.time()),
    )
