"""Recovery from lost nodes: salvage what the interrupted run can still give, keep the nodes
that survived, replace only the lost ones (launched early after a notice, see
`early_replacement`), or end them all so the whole cluster moves.

`Recovery` is a strategy the runner owns. Each of its steps ends what must end and returns
the next launch as a value (`NextLaunch`: `Fresh`, `ReplaceLost` or `ReuseKept`), which the
runner's bring-up hands back to `replace_lost` or to the launcher. What it keeps between calls
is its own: the zones that just took nodes back (tried last by the next whole launch) and the
replacements launched at a notice until a launch takes them (the runner's teardown ends them
with `end_early`).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.current_attempt import CurrentAttempt
from orchestrator.control.run.early_replacement import EarlyLaunch
from orchestrator.control.run.ending import NodeEnder
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.launcher import Launcher
from orchestrator.control.run.options import Reporter
from orchestrator.control.run.recovery_rules import Interruption, may_recover
from orchestrator.control.run.replacing import market_matches, survivors
from orchestrator.control.run.resume_fallback import FALLBACK_EVENT, fallback_due
from orchestrator.control.run.salvage import Salvage
from orchestrator.errors import CapacityError, JobFailed, OrchError
from orchestrator.ledger.store import utcnow
from orchestrator.node.launch import NodeLayout
from orchestrator.providers.base import Instance, Provider
from orchestrator.spec.model import JobSpec
from orchestrator.spot.driver import DeadlineDriver


@dataclass(frozen=True)
class Fresh:
    """Launch every node of the run anew; `avoid_zones` (zones that just took nodes back)
    are tried last."""

    avoid_zones: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplaceLost:
    """Launch one node per rank the `survivors` lack, beside them, in their zone, type and
    market (none when they hold every rank: the run restarts on them); `early`: replacements
    launched at the notice, taken instead when they fit."""

    survivors: tuple[Instance, ...]
    early: EarlyLaunch | None = None


@dataclass(frozen=True)
class ReuseKept:
    """Run on the kept cluster's nodes when they are all up; else launch anew, as `Fresh`."""

    avoid_zones: tuple[str, ...] = ()


NextLaunch = Fresh | ReplaceLost | ReuseKept


class Recovery:
    """How one job's runner recovers from an interruption (see the module docstring).

    `kept`: the job runs on a kept cluster, whose nodes are never kept through a recovery
    (they are taken anew only at a job's start). `driver`: the spot policy, if any; it
    chooses the market (and zone) a launch is meant for, and learns of the spot refused.
    """

    def __init__(
        self,
        *,
        spec: JobSpec,
        journal: Journal,
        reporter: Reporter,
        provider: Provider,
        current: CurrentAttempt,
        launcher: Launcher,
        salvage: Salvage,
        nodes: NodeEnder,
        keeper: CheckpointKeeper,
        layout: NodeLayout,
        driver: DeadlineDriver | None,
        kept: bool,
    ) -> None:
        self.spec = spec
        self.journal = journal
        self.reporter = reporter
        self.provider = provider
        self.current = current
        self.launcher = launcher
        self.salvage = salvage
        self.nodes = nodes
        self.keeper = keeper
        self.layout = layout
        self.driver = driver
        self.kept = kept
        self._avoid_zones: tuple[str, ...] = ()  # zones that just took nodes back
        self._early: EarlyLaunch | None = None  # launched at a notice, no launch took it yet

    def fresh(self) -> Fresh | ReuseKept:
        """The launch of a whole run: on the kept cluster's nodes for a job on one, else new
        nodes away from the zones that last took nodes back."""
        return ReuseKept(self._avoid_zones) if self.kept else Fresh(self._avoid_zones)

    def note(self, interruption: Interruption) -> None:
        """The interruption as a PREEMPTED event and a phase line."""
        self.journal.event(
            "PREEMPTED",
            f"{interruption.cause}: {interruption.describe()}",
            step=self.journal.last_step,
        )
        self.reporter.phase(f"interrupted: {interruption.describe()}")

    def launch_early(self, interruption: Interruption) -> EarlyLaunch | None:
        """After a notice, launch the noticed nodes' replacements now, beside the salvage
        (see `early_replacement`); None where a recovery would not keep survivors."""
        job = self.journal.job
        if (
            interruption.cause != "notice"
            or self.kept
            or self.driver is not None
            or self.spec.recovery.replace != "lost"
            or not may_recover(job.recoveries, self.spec.recovery.max_recoveries)
        ):
            return None
        staying = survivors(self.current.attempt, interruption, self.provider)
        if not staying:
            return None
        launcher, pull_wait = self.launcher, self.salvage.pull_wait()
        self._early = EarlyLaunch.start(
            staying,
            lambda launched: launcher.launch_early(staying, pull_wait=pull_wait, launched=launched),
            launcher.copy_to,
        )
        return self._early

    def recover(self, interruption: Interruption, early: EarlyLaunch | None = None) -> NextLaunch:
        """End the interrupted run's lost nodes (all of them when none may stay) and return
        the launch that brings the run back; `early`: the replacements `launch_early` made.

        Raises `JobFailed` (nothing is replaced) once `recovery.max_recoveries` are used up.
        """
        limit = self.spec.recovery.max_recoveries
        done = self.journal.job.recoveries
        if not may_recover(done, limit):
            raise JobFailed(
                f"{interruption.cause}: {interruption.describe()}; no recovery left "
                f"(recovery.max_recoveries is {limit}, {done} used)",
                hint="raise recovery.max_recoveries, or run on on-demand nodes (--no-spot); the "
                "newest checkpoint is in the job's directory",
            )
        attempt = self.current.attempt
        instances = attempt.instances
        staying = (
            survivors(attempt, interruption, self.provider)
            if not self.kept and self.spec.recovery.replace == "lost"
            else []
        )
        if staying:
            if self._keep_survivors(interruption, staying, f"recovery {done + 1} of {limit}"):
                return ReplaceLost(tuple(staying), early)
            self._take_early(early, [])  # they did not answer and ended: so does what was early
            return self.fresh()
        self._take_early(early, [])
        self.journal.recovering(
            f"recovery {done + 1} of {limit}: replacing {len(instances) or 'the'} node(s)",
            recoveries=done + 1,
        )
        taken = set(interruption.instance_ids)
        self._avoid_zones = tuple({i.zone for i in instances if i.instance_id in taken} - {None})
        self.current.end()
        return self.fresh()

    def replace_lost(self, plan: ReplaceLost) -> Fresh | ReuseKept | None:
        """Launch replacements for the ranks the survivors lack; None once the run's nodes
        are up (held in `current`). Else, with the survivors ended, the launch that moves the
        whole cluster: the zone has no capacity for the replacements, or the spot policy
        wants another market. A zone-aware policy learns that the zone has no spot left and
        the `CapacityError` is raised (the policy chooses where the cluster goes)."""
        staying = list(plan.survivors)
        driver = self.driver
        launch_spot = driver.launch_spot if driver is not None else None
        zones = driver.launch_zones if driver is not None else None
        if market_matches(staying, launch_spot, zones[0] if zones else None):
            try:
                if (ready := self._take_early(plan.early, staying)) is not None:
                    self.launcher.join_replacements(staying, ready, early=True)
                else:
                    self.launcher.replace_lost(staying, pull_wait=self.salvage.pull_wait())
                return None
            except CapacityError as exc:
                self.journal.event(
                    "WARNING", f"no capacity for the replacement node(s) beside the "
                    f"{len(staying)} that stayed ({exc.message}); the whole cluster moves",
                )  # fmt: skip
                self._avoid_zones = tuple({i.zone for i in staying} - {None})
                if driver is not None and zones and launch_spot:
                    driver.spot_refused(staying[0].zone)
                    self.abandon(plan)
                    raise
        return self.abandon(plan)

    def abandon(self, plan: NextLaunch) -> Fresh | ReuseKept:
        """End what `plan` keeps (its survivors, the replacements launched at the notice): the
        whole cluster moves, or the job waits with no node; the launch that starts anew."""
        if isinstance(plan, ReplaceLost):
            self._take_early(plan.early, [])
            if plan.survivors:
                self.current.hold(Attempt(list(plan.survivors)))
                self.current.end()
        else:
            self.end_early()
        return self.fresh()

    def end_early(self) -> None:
        """End the replacements launched at a notice that no launch took (the job ends)."""
        self._take_early(self._early, [])

    def _take_early(
        self, early: EarlyLaunch | None, staying: list[Instance]
    ) -> list[Instance] | None:
        """The replacements launched at the notice, when they fit `staying` (else they are
        ended, and None: the caller launches anew). Waits for their launch and copy. Each
        early launch is taken once: None for one taken before."""
        if early is None or early is not self._early:
            return None
        self._early = None
        early.wait()
        ready = early.usable_for(staying) if staying else None
        if ready is None and early.launched:
            why = f": {early.error}" if early.error else ""
            self.journal.event("WARNING", f"the replacement(s) launched at the notice are "
                               f"ended{why}")  # fmt: skip
            self.nodes.terminate_these(
                [i.instance_id for i in early.launched], known=early.launched
            )
        return ready

    def _keep_survivors(
        self, interruption: Interruption, staying: list[Instance], what: str
    ) -> bool:
        """End the lost nodes only; stop the survivors' run and clear its state, so that a
        launch of replacements beside them restarts it. False when a survivor did not answer
        (then every node ended)."""
        attempt = self.current.attempt
        kept = {i.instance_id for i in staying}
        lost = [i for i in attempt.instances if i.instance_id not in kept]
        lost_ids = {i.instance_id for i in lost} | set(interruption.instance_ids)
        lost_ranks = {i.rank for i in lost} | set(interruption.ranks)
        self.journal.recovering(
            f"{what}: replacing {len(lost_ranks)} lost node(s); "
            f"{len(staying)} node(s) stay ({', '.join(sorted(kept))})",
            recoveries=self.journal.job.recoveries + 1,
        )
        attempt.gone_ranks |= {i.rank for i in lost}
        self.nodes.terminate_these(sorted(lost_ids), known=lost)
        attempt.instances = list(staying)
        try:  # after a notice the salvage stopped the run gracefully; after a loss the run
            # waits on its lost peer: either way what is left of it is killed
            attempt.clear_runs(self.layout, [i.rank for i in staying])
        except OrchError as exc:
            self.journal.event(
                "WARNING", f"a node that was to stay did not answer ({exc}); they all end"
            )
            self.current.end()
            return False
        self.current.let_go()
        self._avoid_zones = ()
        return True

    def fall_back(self, failure: JobFailed) -> NextLaunch | None:
        """After a run failed: when it could not load the checkpoint it resumed
        (`resume_fallback.fallback_due`), hold that one back and return the restart on the
        same nodes from the complete one before it (FALLBACK event). None, with the job's
        failure to stand, otherwise (a WARNING event says why when there is no checkpoint to
        fall back to)."""
        attempt, job = self.current.attempt, self.journal.job
        if self.kept or not attempt.connected:
            return None  # a kept cluster's nodes are taken anew only at a job's start
        failed = fallback_due(failure.message, self.journal.ledger.events(job.id), utcnow())
        if failed is None:
            return None
        held = self.keeper.hold_back()
        before = self.keeper.newest() if held is not None else None
        if held is None or before is None:
            self.journal.event(
                "WARNING", f"the run could not load the checkpoint of step {failed.step} "
                f"({failed.error}); orch holds no complete checkpoint before it to fall back to",
                step=failed.step,
            )  # fmt: skip
            return None
        self.journal.event(
            FALLBACK_EVENT, f"the run could not load {held.name} ({failed.error}); it restarts "
            f"once, on the same nodes, from {before.name}, the complete checkpoint before it "
            f"({held.name} is set aside on every node)",
            step=before.step,
        )  # fmt: skip
        staying = list(attempt.instances)
        self.journal.recovering(
            f"restarting on the same {len(staying)} node(s) from {before.name}",
            recoveries=job.recoveries,
        )
        try:
            attempt.clear_runs(self.layout, [i.rank for i in staying])
        except OrchError as exc:
            self.journal.event("WARNING", f"a node did not answer ({exc}); they all end")
            self.current.end()
            return self.fresh()
        self.current.let_go()
        return ReplaceLost(tuple(staying))

    def restart_from_scratch(self) -> Fresh | ReuseKept:
        """The controller died before training started: end what it launched; the launch
        that starts over."""
        self.journal.event(
            "RESTARTED",
            f"found {self.journal.job.state} without a controller; its nodes are replaced",
        )
        self.current.end()
        return self.fresh()
