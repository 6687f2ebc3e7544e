"""Recovery from lost nodes, for the job runner: salvage what the interrupted run can still
give, keep the nodes that survived, replace only the lost ones (launched early after a notice,
see `early_replacement`), or end them all so the whole cluster moves.

`Recovering` holds no state of its own: it is the runner's recovery half, kept apart so that
each file reads as one job. Its methods use the runner's attempt, journal, launcher, node
ender and salvage (declared below for the type checker).
"""

from __future__ import annotations

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.control.attempt import Attempt
from orchestrator.control.early_replacement import EarlyLaunch
from orchestrator.control.ending import NodeEnder
from orchestrator.control.journal import Journal
from orchestrator.control.kept_nodes import KeptNodes
from orchestrator.control.launching import Launcher
from orchestrator.control.options import Reporter
from orchestrator.control.recovery_rules import Interruption, may_recover
from orchestrator.control.replacing import market_matches, survivors
from orchestrator.control.resume_fallback import FALLBACK_EVENT, fallback_due
from orchestrator.control.salvage import Salvage
from orchestrator.errors import CapacityError, JobFailed, OrchError
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.node import launch
from orchestrator.providers.base import Instance, Provider
from orchestrator.spec.model import JobSpec
from orchestrator.spot.driver import DeadlineDriver


class Recovering:
    """The runner's recovery steps (mixed into `JobRunner`)."""

    attempt: Attempt
    journal: Journal
    launcher: Launcher
    nodes: NodeEnder
    salvage: Salvage
    keeper: CheckpointKeeper
    ledger: Ledger
    provider: Provider
    reporter: Reporter
    spec: JobSpec
    layout: launch.NodeLayout
    kept: KeptNodes | None
    _driver: DeadlineDriver | None
    _survivors: list[Instance]
    _early: EarlyLaunch | None
    _avoid_zones: tuple[str, ...]

    @property
    def job(self) -> Job:
        raise NotImplementedError

    def _end_attempt(self) -> object:
        raise NotImplementedError

    def _keep_attempt(self, attempt: Attempt) -> None:
        raise NotImplementedError

    def _replace_lost(self) -> bool:
        """Launch replacements for the ranks the survivors lack; True once the run's nodes
        are up. False, with the survivors ended, when the zone has no capacity for the
        replacements or the spot policy wants another market: the whole cluster moves."""
        survivors, self._survivors = self._survivors, []
        driver = self._driver
        launch_spot = driver.launch_spot if driver is not None else None
        zones = driver.launch_zones if driver is not None else None
        if market_matches(survivors, launch_spot, zones[0] if zones else None):
            try:
                if (early := self._take_early(survivors)) is not None:
                    self.launcher.join_replacements(
                        survivors, early, keep=self._keep_attempt, early=True
                    )
                else:
                    self.launcher.replace_lost(
                        survivors, pull_wait=self.salvage.pull_wait(), keep=self._keep_attempt
                    )
                return True
            except CapacityError as exc:
                self.journal.event(
                    "WARNING", f"no capacity for the replacement node(s) beside the "
                    f"{len(survivors)} that stayed ({exc.message}); the whole cluster moves",
                )  # fmt: skip
                self._avoid_zones = tuple({i.zone for i in survivors} - {None})
                if driver is not None and zones and launch_spot:
                    # A zone-aware policy learns that this zone has no spot left and
                    # chooses where the cluster goes (`_bring_up_on_policy`).
                    driver.spot_refused(survivors[0].zone)
                    self._survivors = survivors
                    self._end_survivors()
                    raise
        self._survivors = survivors
        self._end_survivors()
        return False

    def _end_survivors(self) -> None:
        """End the nodes kept through a recovery: the whole cluster moves, or the job waits."""
        self._take_early([])
        if self._survivors:
            self.attempt = Attempt(self._survivors)
            self._survivors = []
            self._end_attempt()

    def _launch_early(self, interruption: Interruption) -> EarlyLaunch | None:
        """After a notice, launch the noticed nodes' replacements now, beside the salvage
        (see `early_replacement`); None where a recovery would not keep survivors."""
        if (
            interruption.cause != "notice"
            or self.kept is not None
            or self._driver is not None
            or self.spec.recovery.replace != "lost"
            or not may_recover(self.job.recoveries, self.spec.recovery.max_recoveries)
        ):
            return None
        staying = survivors(self.attempt, interruption, self.provider)
        if not staying:
            return None
        launcher, pull_wait = self.launcher, self.salvage.pull_wait()
        return EarlyLaunch.start(
            staying,
            lambda keep: launcher.launch_early(staying, pull_wait=pull_wait, keep=keep),
            launcher.copy_to,
        )

    def _take_early(self, survivors: list[Instance]) -> list[Instance] | None:
        """The replacements launched at the notice, when they fit `survivors` (else they are
        ended, and None: the caller launches anew). Waits for their launch and copy."""
        early, self._early = self._early, None
        if early is None:
            return None
        early.wait()
        ready = early.usable_for(survivors) if survivors else None
        if ready is None and early.launched:
            why = f": {early.error}" if early.error else ""
            self.journal.event("WARNING", f"the replacement(s) launched at the notice are "
                               f"ended{why}")  # fmt: skip
            self.nodes.terminate_these(
                [i.instance_id for i in early.launched], known=early.launched
            )
        return ready

    def _salvage(self, interruption: Interruption) -> None:
        self._note_interruption(interruption)
        self.salvage.interrupted(self.attempt, interruption)

    def _note_interruption(self, interruption: Interruption) -> None:
        self.journal.event(
            "PREEMPTED",
            f"{interruption.cause}: {interruption.describe()}",
            step=self.journal.last_step,
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
        staying = (
            survivors(self.attempt, interruption, self.provider)
            if self.kept is None and self.spec.recovery.replace == "lost"
            else []
        )
        if staying:
            self._keep_survivors(interruption, staying, f"recovery {done + 1} of {limit}")
            if not self._survivors:  # they did not answer and ended: so does what was early
                self._take_early([])
            return
        self._take_early([])
        self.journal.recovering(
            f"recovery {done + 1} of {limit}: replacing {len(instances) or 'the'} node(s)",
            recoveries=done + 1,
        )
        taken = set(interruption.instance_ids)
        self._avoid_zones = tuple({i.zone for i in instances if i.instance_id in taken} - {None})
        self._end_attempt()

    def _keep_survivors(
        self, interruption: Interruption, staying: list[Instance], what: str
    ) -> None:
        """End the lost nodes only; stop the survivors' run and clear its state, so that
        `_provision` launches replacements beside them."""
        attempt = self.attempt
        kept = {i.instance_id for i in staying}
        lost = [i for i in attempt.instances if i.instance_id not in kept]
        lost_ids = {i.instance_id for i in lost} | set(interruption.instance_ids)
        lost_ranks = {i.rank for i in lost} | set(interruption.ranks)
        self.journal.recovering(
            f"{what}: replacing {len(lost_ranks)} lost node(s); "
            f"{len(staying)} node(s) stay ({', '.join(sorted(kept))})",
            recoveries=self.job.recoveries + 1,
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
            self._end_attempt()
            return
        attempt.close()
        self.attempt = Attempt.not_launched()
        self._avoid_zones = ()
        self._survivors = staying

    def _fall_back(self, failure: JobFailed) -> bool:
        """After a run failed: when it could not load the checkpoint it resumed
        (`resume_fallback.fallback_due`), hold that one back and ready a restart on the same
        nodes from the complete one before it (FALLBACK event; the caller brings the run up);
        True then. False, with the job's failure to stand, otherwise (a WARNING event says
        why when there is no checkpoint to fall back to)."""
        if self.kept is not None or not self.attempt.connected:
            return False  # a kept cluster's nodes are taken anew only at a job's start
        failed = fallback_due(failure.message, self.ledger.events(self.job.id), utcnow())
        if failed is None:
            return False
        held = self.keeper.hold_back()
        before = self.keeper.newest() if held is not None else None
        if held is None or before is None:
            self.journal.event(
                "WARNING", f"the run could not load the checkpoint of step {failed.step} "
                f"({failed.error}); orch holds no complete checkpoint before it to fall back to",
                step=failed.step,
            )  # fmt: skip
            return False
        self.journal.event(
            FALLBACK_EVENT, f"the run could not load {held.name} ({failed.error}); it restarts "
            f"once, on the same nodes, from {before.name}, the complete checkpoint before it "
            f"({held.name} is set aside on every node)",
            step=before.step,
        )  # fmt: skip
        attempt, staying = self.attempt, list(self.attempt.instances)
        self.journal.recovering(
            f"restarting on the same {len(staying)} node(s) from {before.name}",
            recoveries=self.job.recoveries,
        )
        try:
            attempt.clear_runs(self.layout, [i.rank for i in staying])
        except OrchError as exc:
            self.journal.event("WARNING", f"a node did not answer ({exc}); they all end")
            self._end_attempt()
            return True
        attempt.close()
        self.attempt = Attempt.not_launched()
        self._survivors = staying
        return True

    def _restart_from_scratch(self) -> None:
        """The controller died before training started: end what it launched, start over."""
        self.journal.event(
            "RESTARTED", f"found {self.job.state} without a controller; its nodes are replaced"
        )
        self._end_attempt()
