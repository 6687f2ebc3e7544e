"""Collecting what a run leaves (checkpoints, logs) before its nodes are ended."""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper
from orchestrator.cluster.checkpoints.kept_summary import kept_phrase
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter, RunnerOptions
from orchestrator.control.run.recovery_rules import Interruption, salvage_seconds
from orchestrator.errors import OrchError
from orchestrator.ledger.store import utcnow
from orchestrator.node.launch import NodeLayout
from orchestrator.providers.base import Provider


class OutputUpload(Protocol):
    """Uploads a job's outputs from `ranks` of `attempt` within `timeout_s`; never raises."""

    def __call__(self, attempt: Attempt, ranks: set[int], timeout_s: float) -> None: ...


class Salvage:
    """Pulls checkpoints off an attempt's nodes; never ends a node (billing goes on until the
    runner ends them). Nodes found gone are never asked (each would cost a timeout)."""

    def __init__(
        self,
        *,
        keeper: CheckpointKeeper,
        journal: Journal,
        reporter: Reporter,
        provider: Provider,
        layout: NodeLayout,
        options: RunnerOptions,
        store_only: bool,
        upload_outputs: OutputUpload | None = None,
    ) -> None:
        """`store_only`: the job's checkpoints are kept in its store alone (no mirror here).
        `upload_outputs`: sends the job's outputs from the given ranks within a time bound
        (after a notice, from the nodes about to go)."""
        self.keeper = keeper
        self.journal = journal
        self.reporter = reporter
        self.provider = provider
        self.layout = layout
        self.options = options
        self.store_only = store_only
        self.upload_outputs = upload_outputs

    def pull_wait(self) -> float:
        """How long the nodes' agents may take to stage what a run left (longer when the
        store holds the only copy)."""
        if self.store_only:
            return self.options.store_only_wait
        return self.options.final_pull_wait

    def final_pull(self, attempt: Attempt) -> None:
        """Collect what the run left, once the nodes' agents staged it (bounded wait)."""
        self.keeper.finish(skip=attempt.gone_ranks, wait_s=self.pull_wait())

    def interrupted(self, attempt: Attempt, interruption: Interruption) -> None:
        """Keep what the interrupted run can still give before its nodes go (SALVAGED).

        After a notice the nodes still run: every trainer gets SIGTERM (rank 0 writes its
        emergency checkpoint), and what the agents stage of it is collected before the reclaim.
        Without a notice, what the nodes that still answer hold is collected: a checkpoint
        that needed a lost node's files is whole only if those arrived before it was lost.
        """
        started = time.monotonic()
        grace = salvage_seconds(interruption, utcnow(), self.options.stop_grace)
        if grace > 0:
            attempt.stop_trainers(self.layout, grace)
        skip = self._unanswering(attempt, interruption)
        if len(skip) < len(attempt.instances):
            wait = salvage_seconds(interruption, utcnow(), self.options.final_pull_wait)
            try:
                self.keeper.finish(skip=skip, wait_s=wait if interruption.cause == "notice" else 0)
            except OrchError as exc:
                self.journal.event("WARNING", f"salvage pull failed: {exc}")
        if interruption.cause == "notice" and attempt.watch is not None:
            with contextlib.suppress(OrchError):
                attempt.watch.catch_up()
        if interruption.cause == "notice" and self.upload_outputs is not None:
            left = salvage_seconds(interruption, utcnow(), self.options.final_pull_wait)
            if left > 0:
                self.upload_outputs(attempt, set(interruption.ranks), left)
        self._salvaged(started)

    def adopted(self, attempt: Attempt, interruption: Interruption) -> None:
        """A new controller connected to the nodes of a job that still run and found other
        ranks gone (a job rebuilt from its nodes: `control.repair.rebuild`). Their agents only just
        started and their run waits on the lost peers: stop it (the trainers get SIGTERM and
        `stop_grace`), then collect what the agents stage of the checkpoints the nodes hold (at
        most `pull_wait`), so that the restart resumes from them (SALVAGED)."""
        started = time.monotonic()
        try:
            attempt.stop_trainers(self.layout, self.options.stop_grace)
            self.keeper.finish(skip=set(interruption.ranks), wait_s=self.pull_wait())
        except OrchError as exc:
            self.journal.event("WARNING", f"salvage pull failed: {exc}")
        self._salvaged(started)

    def _salvaged(self, started: float) -> None:
        """SALVAGED: what the job holds now (the newest directory checkpoint and single
        files, each with its step and age) and how long the salvage took."""
        kept = self.keeper.kept()
        held = kept_phrase(kept, utcnow())
        self.journal.event(
            "SALVAGED", f"{held}, {time.monotonic() - started:.1f} s after detection",
            step=kept[0].step if kept else None,
        )  # fmt: skip
        self.reporter.line(f"[orch] salvaged: {held}")

    def _unanswering(self, attempt: Attempt, interruption: Interruption) -> set[int]:
        """Nodes not to ask for checkpoints after an interruption: those lost or taken, and
        those that missed the last probe or that the provider reports taken meanwhile (asking
        them would cost a connection timeout). After a notice every node still runs."""
        if interruption.cause == "notice" or not attempt.instances:
            return set()
        skip = set(interruption.ranks) | set(attempt.gone_ranks)
        if attempt.watch is not None:
            skip |= {rank for rank, misses in enumerate(attempt.watch.misses) if misses}
        rest = [i for i in attempt.instances if i.rank not in skip]
        taken = self.provider.preempted([i.instance_id for i in rest]) if rest else set()
        return skip | {i.rank for i in rest if i.instance_id in taken}
