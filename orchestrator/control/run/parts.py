"""One job's collaborators, built once (no I/O) for its runner, which hands each of its
parts (launcher, supervisor, recovery, ...) the ones it works with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, KeeperOptions
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.config import Settings
from orchestrator.control.money.team_caps import TeamCaps
from orchestrator.control.run.guards import Guards
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter, RunnerOptions
from orchestrator.ledger.store import Job, Ledger
from orchestrator.node import launch
from orchestrator.providers.base import Provider
from orchestrator.spec.model import JobSpec, LoadedJob
from orchestrator.spot.driver import DeadlineDriver, price_request
from orchestrator.spot.inputs import DriverState


@dataclass(frozen=True)
class JobParts:
    """One job's collaborators; `driver` (the spot policy) is None unless the spec names a
    spot_policy or the runner was given one."""

    journal: Journal
    loaded: LoadedJob
    settings: Settings
    options: RunnerOptions
    provider: Provider
    reporter: Reporter
    keeper: CheckpointKeeper
    guards: Guards
    layout: launch.NodeLayout
    job_dir: Path
    driver: DeadlineDriver | None
    team: TeamCaps | None = None  # the monthly caps (`budget` settings); None: none set

    @property
    def spec(self) -> JobSpec:
        return self.loaded.spec


def job_parts(
    job: Job,
    loaded: LoadedJob,
    *,
    settings: Settings,
    ledger: Ledger,
    provider: Provider,
    reporter: Reporter,
    options: RunnerOptions,
    keeper: CheckpointKeeper | None = None,
    driver: DeadlineDriver | None = None,
) -> JobParts:
    """The collaborators of a runner for `job` (no I/O); `keeper` defaults to one that
    collects the job's checkpoints into its directory under ORCH_HOME, `driver` to the spot
    policy the spec names (None without one)."""
    spec = loaded.spec
    layout = launch.NodeLayout(job.node_owner)
    job_dir = settings.job_dir(job.id)
    keeper = keeper or CheckpointKeeper(
        job_id=job.id,
        checkpoint=spec.checkpoint,
        node_dir=layout.node_path(spec.checkpoint.dir),
        mirror=CheckpointMirror(job_dir / "checkpoints"),
        ledger=ledger,
        settings=settings,
        line=reporter.line,
        options=KeeperOptions(
            pull_every=spec.checkpoint.pull_every, push_timeout_s=options.push_timeout
        ),
        node_owner=job.node_owner,
    )
    journal = Journal(job, ledger, reporter)
    team = TeamCaps(settings.budget, ledger) if settings.budget.capped else None
    if driver is None and spec.spot_policy is not None:
        driver = DeadlineDriver(
            job_id=job.id,
            spec=spec,
            submitted_at=job.created_at,
            ledger=ledger,
            provider=provider,
            launch_request=price_request(job.id, spec),
            interval_s=options.policy_interval,
            overhead_prior_s=options.restart_overhead_prior,
            state=DriverState.from_json(job.policy_state),
        )
    keys = settings.keys_dir(job.node_owner)  # the nodes' SSH key, which signs their leases
    guards = Guards(journal, spec, options, provider, reporter, keys=keys, team=team)
    return JobParts(
        journal=journal,
        loaded=loaded,
        settings=settings,
        options=options,
        provider=provider,
        reporter=reporter,
        keeper=keeper,
        guards=guards,
        layout=layout,
        job_dir=job_dir,
        driver=driver,
        team=team,
    )
