"""Bringing a run up from the next launch a recovery (or a start, or a move) returns: get the
nodes it names, copy the job over and start the run, on the market the spot policy picks."""

from __future__ import annotations

import time

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.control.money.stop_rules import StopOrder, runtime_order
from orchestrator.control.run.current_attempt import CurrentAttempt
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.kept_nodes import KeptNodes
from orchestrator.control.run.launcher import Launcher
from orchestrator.control.run.options import RunnerOptions
from orchestrator.control.run.recovering import NextLaunch, Recovery, ReplaceLost, ReuseKept
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.salvage import Salvage
from orchestrator.errors import CapacityError, ProviderError, RemoteError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import utcnow
from orchestrator.providers.base import Provider
from orchestrator.spec.model import JobSpec
from orchestrator.spot.driver import DeadlineDriver
from orchestrator.spot.policies import Decision as Market


class BringUp:
    """Gets one job's run going: `provision` the nodes a `NextLaunch` names, `start` (also
    sync) the run on them, `on_policy` on the spot policy's market. What it launches is held
    in `current`; nothing here ends a node but what a recovery step ends."""

    def __init__(
        self,
        *,
        spec: JobSpec,
        journal: Journal,
        options: RunnerOptions,
        provider: Provider,
        current: CurrentAttempt,
        launcher: Launcher,
        recovery: Recovery,
        salvage: Salvage,
        keeper: CheckpointKeeper,
        kept: KeptNodes | None,
        driver: DeadlineDriver | None,
    ) -> None:
        self.spec = spec
        self.journal = journal
        self.options = options
        self.provider = provider
        self.current = current
        self.launcher = launcher
        self.recovery = recovery
        self.salvage = salvage
        self.keeper = keeper
        self.kept = kept
        self.driver = driver

    def provision(self, plan: NextLaunch | None = None) -> None:
        """Get the nodes `plan` names (default: a whole run's), held in `current`."""
        plan = plan or self.recovery.fresh()
        if isinstance(plan, ReuseKept):
            assert self.kept is not None  # a plan only for a job on a kept cluster
            if self.kept.reuse():
                return
        elif isinstance(plan, ReplaceLost):
            moved = self.recovery.replace_lost(plan)
            if moved is None:
                return
            plan = moved
        self.launcher.provision(avoid_zones=plan.avoid_zones, pull_wait=self.salvage.pull_wait())
        if self.kept is not None:
            self.kept.launched()

    def start(self, plan: NextLaunch | None = None) -> None:
        """Provision as `plan` says (default: a whole run's nodes), sync and start the run;
        nodes the cloud takes on the way are replaced (each time counting as a recovery)."""
        plan = plan or self.recovery.fresh()
        while True:
            try:
                self.provision(plan)
                self.launcher.sync(self.current.attempt)
                self.launcher.start(self.current.attempt)
                return
            except (RemoteError, ProviderError) as exc:
                attempt = self.current.attempt
                if isinstance(exc, CapacityError) or not attempt.instances:
                    raise
                taken = self.provider.preempted(attempt.ids())
                if not taken:
                    raise
                ranks = tuple(i.rank for i in attempt.instances if i.instance_id in taken)
                interruption = Interruption(
                    ranks, tuple(sorted(taken)), "preempted",
                    f"taken by the provider while the job started ({exc.message})", utcnow(),
                )  # fmt: skip
                self.recovery.note(interruption)
                plan = self.recovery.recover(interruption)

    def on_policy(self, plan: NextLaunch, first: Market | None = None) -> StopOrder | None:
        """`start` of `plan` on the market the spot policy picks (`first`, or a fresh
        decision); without a policy, plain `start`.

        While the policy says wait, the job holds with no node (WAITING: what `plan` kept is
        ended first); a spot launch refused for capacity makes the policy decide again, seeing
        no spot, and the next launch is a whole run's. Returns the order to end the job when
        one comes while it waits (max_runtime), else None once the run started.
        """
        driver = self.driver
        if driver is None:
            self.start(plan)
            return None
        decision = first or driver.decide_idle(self.resume_step())
        while True:
            if decision is Market.WAIT:
                plan = self.recovery.abandon(plan)  # nothing billed while the job waits
                order = self._hold(driver)
                if order is not None:
                    return order
                decision = driver.market or Market.ON_DEMAND
            driver.commit(decision)
            try:
                self.start(plan)
                driver.ran_in(self.current.attempt.zone)
                return None
            except CapacityError:
                if decision is not Market.SPOT:
                    raise
                driver.spot_refused()
                decision = driver.decide_idle(self.resume_step())
                plan = self.recovery.fresh()

    def _hold(self, driver: DeadlineDriver) -> StopOrder | None:
        """Wait with no node (nothing billed) until the policy says run; None then."""
        if self.journal.job.state != JobState.WAITING:
            self.journal.waiting(f"{driver.name}: no node until it says run")
        while True:
            started = self.journal.job.started_at
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
            if driver.decide_idle(self.resume_step()) is not Market.WAIT:
                return None

    def resume_step(self) -> int | None:
        """The step a start now would resume from."""
        newest = self.keeper.newest()
        if newest is not None and newest.step is not None:
            return newest.step
        last = self.journal.last_step
        return last if last is not None else self.journal.job.step
