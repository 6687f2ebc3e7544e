"""What `orch submit` and `orch down` do, apart from showing it (`orch cancel`:
`control.verbs.cancel`).

Each command is a function that does the work and returns a dataclass saying what happened;
the CLI turns that into text, `--json` documents and exit codes. Errors are `OrchError`s.
Asking a person anything (the spend guard's question) is the CLI's part: it happens between
`prepare_submit` and `submit_detached` / `submit_foreground`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config import Settings
from orchestrator.control.money.team_caps import SubmitBudget, TeamCaps
from orchestrator.control.process.adoption import plan_adoption
from orchestrator.control.process.controllers import (
    ControllerLock,
    controller_running,
    new_job_id,
    register_job,
    spawn_controller,
    wait_for_controller,
)
from orchestrator.control.process.lease_keeper import LeaseKeeper, keep_lease
from orchestrator.control.process.ownership import Partition, partition
from orchestrator.control.run.end_nodes import end_nodes
from orchestrator.control.run.kept_turn import KeptRequest, cluster_scope, is_mine, join_cluster
from orchestrator.control.verbs.data_check import DataCheck, check_data
from orchestrator.control.verbs.notify import notify_end, save_notify
from orchestrator.control.verbs.stale_files import StaleCheckpoints, find_stale
from orchestrator.errors import FleetFull, OrchError, SpecError, UnknownJob
from orchestrator.job_state import JobState
from orchestrator.ledger.admission import admission_lock
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.store import ControllerLease, Job, KeptCluster, Ledger, utcnow
from orchestrator.providers import get_provider
from orchestrator.providers.base import Instance, Provider
from orchestrator.providers.plan import DryRun, LaunchPlan
from orchestrator.providers.requests import launch_request
from orchestrator.spec.loading import load_job
from orchestrator.spec.model import LoadedJob

if TYPE_CHECKING:
    from orchestrator.control.run.runner import JobOutcome, Reporter

# A person watches a foreground job: its log and progress are polled every second.
FOREGROUND_WATCH_INTERVAL = 1.0


# --- submit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedSubmit:
    """A job read and checked, with the launch it would get; nothing registered or launched."""

    loaded: LoadedJob  # the spec with flags and the settings' default max_runtime applied
    provider: Provider
    dry_run: DryRun  # what the provider would launch first (the `--dry-run` answer)
    notify: str | None = None  # the job's own end-of-job hook (`orch submit --notify`)
    cluster: KeptRequest | None = None  # run on a kept cluster (`orch submit --cluster`)
    team: SubmitBudget | None = None  # the monthly caps' view of it (`check_team_budget`)
    # workdir files under checkpoint.dir that may be taken for a checkpoint (`stale_files`)
    stale: StaleCheckpoints | None = None
    data: DataCheck | None = None  # what was found of the job's data and buckets (`data_check`)

    @property
    def plan(self) -> LaunchPlan:
        return self.dry_run.plan


def refuse_a_queue(prepared: PreparedSubmit) -> None:
    """`--no-wait` on a fleet: `FleetFull` (exit 3) when the job would wait in the fleet's
    queue now (no room for it, or other jobs waiting first). A job that fits now may still
    meet a fleet filled in the moment before its launch, and waits then."""
    document = prepared.dry_run.document
    if prepared.provider.name != "ssh":
        raise SpecError(
            "--no-wait is for kept clusters and fleets",
            hint="add --cluster NAME, or run on a fleet (--fleet NAME)",
        )
    if document.get("fits_now") and not document.get("queued_ahead"):
        return
    fleet = str(document.get("fleet"))
    ahead = int(document.get("queued_ahead") or 0)
    raise FleetFull(
        fleet,
        f"fleet {fleet} has no room for the job now"
        + (f" ({ahead} job(s) already wait for it)" if ahead else ""),
        hint=f"submit without --no-wait to queue, or see `orch fleet status {fleet}`",
    )


@dataclass(frozen=True)
class Detached:
    """A job handed to a background controller, which holds its lock by now."""

    job_id: str


@dataclass(frozen=True)
class Finished:
    """A foreground job driven to its final state."""

    job_id: str
    outcome: JobOutcome  # state, exit code and reason, as the controller ended it


def prepare_submit(
    settings: Settings,
    job_file: Path,
    overrides: Mapping[str, object],
    *,
    now: datetime | None = None,
    fresh: bool = False,
    measure_data: bool = False,
) -> PreparedSubmit:
    """Load `job_file` with the flags' `overrides` (keys such as "resources.nodes"; None: not
    given), give it `controller.default_max_runtime` when it has no max_runtime, check its
    deadline against `now`, and plan it on its provider (`Provider.plan`; may ask the cloud
    for prices). Registers and launches nothing. The workdir's files that may be taken for a
    checkpoint are found (`stale`); with `fresh`, the job's sync leaves them out. Every bucket
    the spec names is checked from this machine (`data_check`); with `measure_data` (a dry
    run) each local data source and bucket prefix is measured too.

    Raises `SpecError` for a bad spec or flags, for a deadline already passed and for a bucket
    that is not ready (`data_check.check_data`), and
    `CapacityError` when no offer fits the job's resources.
    """
    loaded = load_job(job_file, dict(overrides))
    default_runtime = settings.controller.default_max_runtime
    if default_runtime is not None and loaded.spec.budget.max_runtime is None:
        loaded = load_job(job_file, {**overrides, "budget.max_runtime": default_runtime})
    now = now or utcnow()
    deadline = loaded.spec.deadline_at(now)
    if deadline is not None and deadline <= now:
        raise SpecError(
            f"deadline {deadline:%Y-%m-%dT%H:%M:%SZ} has already passed",
            hint="give a later time, or a duration after submit such as deadline: 36h",
        )
    data = check_data(loaded, settings, measure=measure_data)
    stale = find_stale(loaded, fresh=fresh)
    if fresh and stale is not None:
        loaded = dataclasses.replace(loaded, left_out=tuple(f.path for f in stale.files))
    provider = get_provider(loaded.spec.provider, settings)
    # No job id yet: the request is named after the spec, which a plan does not look at.
    request = launch_request(loaded.spec, loaded.spec.name)
    plan = provider.plan(request, loaded.spec.budget)
    return PreparedSubmit(loaded, provider, plan, stale=stale, data=data)


def check_hourly_cap(prepared: PreparedSubmit) -> None:
    """Raise `SpecError` when the plan's cluster costs more per hour than
    `budget.max_hourly_usd` allows; a dry run shows such a plan, a launch refuses it."""
    plan, cap = prepared.plan, prepared.loaded.spec.budget.max_hourly_usd
    if cap is not None and plan.hourly_usd > cap:
        raise SpecError(
            f"the plan costs ${plan.hourly_usd}/h, above budget.max_hourly_usd ${cap}/h",
            hint="use fewer or cheaper nodes, or raise budget.max_hourly_usd",
        )


def check_team_budget(
    settings: Settings, ledger: Ledger, prepared: PreparedSubmit, *, owner: str | None = None
) -> PreparedSubmit:
    """Check the job's planned cost against the monthly caps (`budget.monthly_usd`,
    `budget.user_monthly_usd` of `owner`, default `settings.owner_label`) and return the
    submit with their figures, which registering it records as its reservation. Raises
    `BudgetRefused` (exit 4) when it does not fit; nothing is registered or launched then.
    Without caps, returns `prepared` as it is and reads nothing."""
    if not settings.budget.capped:
        return prepared
    checked = TeamCaps(settings.budget, ledger).admit(
        prepared.loaded.spec.budget, prepared.plan, owner or settings.owner_label
    )
    return dataclasses.replace(prepared, team=checked)


def _reserve(settings: Settings, ledger: Ledger, prepared: PreparedSubmit, job_id: str) -> None:
    if prepared.team is not None:
        TeamCaps(settings.budget, ledger).reserve(job_id, prepared.team)


@contextlib.contextmanager
def _admission(
    settings: Settings, ledger: Ledger, prepared: PreparedSubmit
) -> Iterator[PreparedSubmit]:
    """Under monthly caps: the ledger's admission lock (every machine of a shared ledger), held
    while the job is checked once more and registered with its reservation, so that submits
    racing each other never commit more than a cap (`BudgetRefused` then, nothing
    registered). Yields the submit with the caps' figures as they stand under the lock.
    Without caps, nothing is taken."""
    if not settings.budget.capped:
        yield prepared
        return
    with admission_lock(ledger.engine):
        yield check_team_budget(settings, ledger, prepared)


def submit_detached(settings: Settings, ledger: Ledger, prepared: PreparedSubmit) -> Detached:
    """Register the job (PENDING) and start a background controller for it; returns once that
    controller holds the job's lock, and raises `OrchError` if it died at start. From then on
    the controller launches the nodes and bills; `cancel` stops it."""
    job_id = new_job_id(prepared.loaded.spec.name)
    with _admission(settings, ledger, prepared) as admitted:
        register_job(
            settings, ledger, prepared.loaded, prepared.provider.name, job_id,
            cluster_id=_cluster_of(settings, ledger, prepared),
        )  # fmt: skip
        _reserve(settings, ledger, admitted, job_id)
    _note_stale(ledger, job_id, prepared)
    if prepared.notify:
        save_notify(settings, job_id, prepared.notify)
    wait_for_controller(settings, job_id, spawn_controller(settings, job_id))
    return Detached(job_id)


@dataclass
class ForegroundJob:
    """A registered job whose controller is this process, holding its lock; use as a context
    manager, which releases the lock on leaving (also on an error).

    Nothing is launched before `run`. A process that exits without calling `run` leaves a
    PENDING job with a written record, which the next orch command's revival adopts.
    """

    settings: Settings
    ledger: Ledger
    prepared: PreparedSubmit
    job: Job
    lock: ControllerLock
    lease: LeaseKeeper | None = None  # on a shared ledger, the job's controller lease

    def __enter__(self) -> ForegroundJob:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.lease is not None:
            self.lease.stop()
        self.lock.release()

    def run(self, reporter: Reporter) -> Finished:
        """Drive the job to a final state in this process (launch, sync, train, pull, shut the
        nodes down), telling `reporter` what happens. KeyboardInterrupt (Ctrl-C, or the
        SIGTERM of `orch cancel` once turned into one) makes the runner cancel the job: its
        nodes end, and billing stops, before this returns."""
        from orchestrator.control.run.runner import JobRunner, RunnerOptions

        base = self.settings.controller
        options = dataclasses.replace(
            RunnerOptions.from_settings(base),
            watch_interval=min(base.watch_interval, FOREGROUND_WATCH_INTERVAL),
        )
        # on a shared ledger, each of the controller's writes about the job holds its lease
        ledger = self.ledger if self.lease is None else self.lease.fenced(self.ledger)
        try:
            outcome = JobRunner(
                self.job, self.prepared.loaded, settings=self.settings, ledger=ledger,
                provider=self.prepared.provider, reporter=reporter, options=options,
            ).run()  # fmt: skip
        finally:  # the nodes are gone by now, whatever happened
            notify_end(self.settings, self.ledger, self.job.id)
        return Finished(self.job.id, outcome)


def submit_foreground(
    settings: Settings, ledger: Ledger, prepared: PreparedSubmit
) -> ForegroundJob:
    """Register the job (PENDING) with this process as its controller (lock taken first, so no
    revival can adopt it meanwhile); `ForegroundJob.run` then drives it."""
    job_id = new_job_id(prepared.loaded.spec.name)
    lock = ControllerLock(settings, job_id)
    lock.acquire()  # a new id: nobody else can hold it
    try:
        with _admission(settings, ledger, prepared) as admitted:
            job = register_job(
                settings, ledger, prepared.loaded, prepared.provider.name, job_id,
                cluster_id=_cluster_of(settings, ledger, prepared),
            )  # fmt: skip
            _reserve(settings, ledger, admitted, job_id)
        _note_stale(ledger, job_id, prepared)
        lease = keep_lease(settings, ledger, job_id)
    except BaseException:
        lock.release()
        raise
    if prepared.notify:
        save_notify(settings, job_id, prepared.notify)
    return ForegroundJob(settings, ledger, prepared, job, lock, lease)


def _note_stale(ledger: Ledger, job_id: str, prepared: PreparedSubmit) -> None:
    """The job's event about the workdir's files that may be taken for a checkpoint: a
    WARNING when they are synced, LEFT_OUT when `--fresh` leaves them out."""
    if prepared.stale is not None:
        ledger.add_event(job_id, *prepared.stale.event(utcnow()))


def _cluster_of(settings: Settings, ledger: Ledger, prepared: PreparedSubmit) -> str | None:
    """The id of this machine's kept cluster the job runs on (recorded now when new); None:
    nodes of its own."""
    if prepared.cluster is None:
        return None
    resources = prepared.loaded.spec.resources
    return join_cluster(
        ledger, prepared.cluster, provider=prepared.provider.name, nodes=resources.nodes,
        gpus_per_node=resources.gpus_per_node, machine=cluster_scope(settings),
    ).id  # fmt: skip


# --- down -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodesEnded:
    """One job's nodes that `down` terminated (their billing stopped, leases closed)."""

    job_id: str
    provider: str
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class LeftAlone:
    """A kept cluster of another machine (on a shared ledger) that `down` did not end."""

    name: str
    cluster_id: str
    machine: str | None  # the machine that owns it; None: made before clusters recorded it


@dataclass(frozen=True)
class DownResult:
    ended: tuple[NodesEnded, ...]  # per job, in the order they were ended
    not_ours: tuple[str, ...]  # ids of other ledgers' nodes that matched: never touched
    kept_down: tuple[str, ...] = ()  # names of the kept clusters now recorded DOWN
    # on a shared ledger: unfinished jobs another machine drives, or must revive (it holds
    # their keys); their nodes were left alone
    elsewhere: tuple[str, ...] = ()
    left_alone: tuple[LeftAlone, ...] = ()  # other machines' kept clusters: left alone
    forced: tuple[str, ...] = ()  # `force`: jobs whose lease was taken from another machine

    @property
    def nodes(self) -> int:
        return sum(len(group.instance_ids) for group in self.ended)


def down(
    settings: Settings,
    ledger: Ledger,
    cluster: str | None,
    *,
    force: bool = False,
    on_ended: Callable[[NodesEnded], None] | None = None,
    on_forced: Callable[[ControllerLease], None] | None = None,
) -> DownResult:
    """Terminate the nodes of cluster `cluster` (a kept cluster's name or id, or a job id;
    None: every cluster) that belong to this ledger, whatever their job is doing, on every
    provider in use. Each job's nodes are ended together (`end_nodes`: billing stops at the
    provider's acknowledgement, leases closed); `on_ended` hears of each group as soon as it
    is gone, so that what was ended is known even when a later group fails. A job left
    unfinished with no live controller is recorded CANCELLED (exit 130, "orch down"); one
    with a live controller here is left to it, which finds its nodes gone. Nodes of other
    ledgers are returned in `not_ours`, never ended.

    On a shared ledger a member ends only what it drives or owns: the nodes of an unfinished
    job that another machine drives, or that only another machine can drive
    (`control.process.adoption`), are never ended from here (`elsewhere` lists them, and a kept
    cluster such a job runs on stays UP); nor another machine's kept clusters (`left_alone`:
    names are each machine's own, `cluster` names this machine's first). With `force` all of
    them are ended too: the lease of each such job is taken from its controller (`on_forced`
    hears it) and `down` waits for that controller to stop first (it does at its next
    renewal), so that it does not replace the nodes; no checkpoint is pulled (`forced`).
    """
    ended: list[NodesEnded] = []
    others: list[str] = []
    # Nodes first, then the jobs to leave alone: a job is registered before its nodes launch,
    # so every listed node's job is known by then; read the other way round, a teammate's job
    # registered in between would look like nobody's and its new nodes would be ended.
    listed = [(provider, provider.list_owned()) for provider in providers_in_use(settings, ledger)]
    hands_off = (
        plan_adoption(settings, ledger, ledger.jobs()).hands_off
        if settings.ledger.shared
        else set()
    )
    targets, left = _kept_targets(settings, ledger, cluster, force=force)
    left_ids = {c.id for c in left}
    matches: set[str] | None = None  # the nodes' cluster tags to end; None: every node
    if cluster is not None:  # a kept cluster's nodes carry its id as their cluster
        matches = {c.id for c in targets} if targets or left else {cluster}
    elsewhere: set[str] = set()
    keepers: list[LeaseKeeper] = []
    try:
        for provider, instances in listed:
            wanted = [
                i
                for i in instances
                if i.job_id not in left_ids and (matches is None or i.cluster in matches)
            ]
            found = ledger_partition(ledger, wanted)
            others += [i.instance_id for i in found.others]
            by_job: dict[str, list[str]] = {}
            for instance in found.ours:
                by_job.setdefault(instance.job_id, []).append(instance.instance_id)
            for owner, ids in by_job.items():
                theirs = sorted(_jobs_of(ledger, owner) & hands_off)
                if theirs and not force:
                    elsewhere.update(theirs)
                    continue
                for job_id in theirs:  # force: their controllers stop before the nodes end
                    keepers.append(_seize(settings, ledger, job_id, on_forced))
                end_nodes(ledger, provider, owner, ids, home=settings.home)
                for job_id in {owner, *theirs}:
                    _cancelled_by_down(settings, ledger, job_id)
                group = NodesEnded(owner, provider.name, tuple(ids))
                ended.append(group)
                if on_ended is not None:
                    on_ended(group)
        # a cluster a job of another machine runs on stays up, whether its nodes showed or not
        busy = {c.id: _jobs_of(ledger, c.id) & hands_off for c in targets} if not force else {}
        elsewhere.update(*busy.values())
        downed = [c for c in targets if not busy.get(c.id)]
        for up in downed:  # their nodes may have ended on their own already
            Clusters(ledger).down(up.id, utcnow(), "orch down")
    finally:
        for keeper in keepers:
            keeper.stop()
    return DownResult(
        tuple(ended), tuple(others), tuple(up.name for up in downed), tuple(sorted(elsewhere)),
        tuple(LeftAlone(c.name, c.id, c.machine) for c in left),
        tuple(keeper.job_id for keeper in keepers),
    )  # fmt: skip


def _kept_targets(
    settings: Settings, ledger: Ledger, cluster: str | None, *, force: bool
) -> tuple[list[KeptCluster], list[KeptCluster]]:
    """(the UP kept clusters `down` ends, the other machines' ones it leaves alone) for
    `cluster` (a name or id; None: all). A name means this machine's cluster of that name
    when there is one (`kept.cluster_scope`)."""
    scope = cluster_scope(settings)
    candidates = Clusters(ledger).all(up_only=True)
    if cluster is not None:
        candidates = [c for c in candidates if cluster in (c.name, c.id)]
    mine = [c for c in candidates if is_mine(c, scope)]
    theirs = [c for c in candidates if not is_mine(c, scope)]
    if cluster is not None and mine:
        return mine, []
    if not force:
        return mine, theirs
    if cluster is not None and len(theirs) > 1 and all(c.id != cluster for c in theirs):
        raise SpecError(
            f"{len(theirs)} kept clusters are called {cluster}: "
            + ", ".join(f"{c.id} (machine {c.machine})" for c in theirs),
            hint="give the id of the one to end: `orch down ID --force`",
        )
    return mine + theirs, []


def _jobs_of(ledger: Ledger, owner: str) -> set[str]:
    """The unfinished jobs whose nodes carry the owner id `owner`: the job of that id, or
    the jobs on the kept cluster of that id."""
    on_cluster = Clusters(ledger).jobs(owner)
    return {owner} | {job.id for job in on_cluster if not JobState(job.state).is_final}


def _seize(
    settings: Settings,
    ledger: Ledger,
    job_id: str,
    on_forced: Callable[[ControllerLease], None] | None,
) -> LeaseKeeper:
    """Take job `job_id`'s lease by force and wait for its controller elsewhere to stop."""
    keeper = LeaseKeeper(settings, ledger, job_id, on_cancel=lambda asker: None)
    claim = keeper.hold(force=True, on_forced=on_forced)
    if not claim.taken:  # a racing forced take: the other one ends it
        raise OrchError(
            f"the lease of {job_id} was taken by {claim.lease.holder if claim.lease else '?'} "
            "as down took it",
            hint="run `orch down` again",
        )
    return keeper


def _cancelled_by_down(settings: Settings, ledger: Ledger, job_id: str) -> None:
    """Record job `job_id` CANCELLED ("orch down") when it is unfinished and no controller
    of this machine drives it."""
    with contextlib.suppress(UnknownJob):
        job = ledger.get_job(job_id)
        if not JobState(job.state).is_final and not controller_running(settings, job_id):
            ledger.update_job(
                job_id, state=JobState.CANCELLED, exit_code=130, reason="orch down",
                ended_at=utcnow(),
            )  # fmt: skip


def cluster_not_found(cluster: str) -> SpecError:
    """The error of a `down CLUSTER` that found no node of that cluster in this ledger."""
    return SpecError(
        f"no running cluster {cluster!r} of this ledger",
        hint="`orch status` lists jobs; a cluster of another ledger is ended from there",
    )


# --- what the commands share ----------------------------------------------------------------


def providers_in_use(settings: Settings, ledger: Ledger) -> list[Provider]:
    """The local provider, plus AWS when a job used it or an endpoint is configured."""
    names = {"local"} | {job.provider for job in ledger.jobs()}
    if settings.aws.endpoint_url:
        names.add("aws")
    return [get_provider(name, settings) for name in sorted(names)]


def ledger_partition(ledger: Ledger, instances: list[Instance]) -> Partition:
    """`instances` split into this ledger's and the others
    (`orchestrator.control.process.ownership`)."""
    leased = {lease.instance_id for lease in ledger.leases()}
    return partition(instances, ledger.ledger_id, leased=leased)
