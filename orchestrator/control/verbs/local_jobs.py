"""`LocalJobs`: the jobs of this ORCH_HOME's ledger (see `control.verbs.jobs.Jobs`).

The same code paths the commands always took: `commands` prepares and hands on a submit,
`cancel` ends a job, the ledger's documents (`report.documents`) describe and bill it, and the
controller's mirrored node logs are read with `cluster.log_lines`. The controller host's
`orch controller answer` uses it to answer `HostJobs`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orchestrator.control.verbs.jobs import CancelOutcome, LogsRequest, Say, SubmitRequest, View
from orchestrator.errors import SpecError
from orchestrator.job_state import JobState

if TYPE_CHECKING:
    from orchestrator.cluster.log_lines import LogLine
    from orchestrator.config import Settings
    from orchestrator.control.verbs.commands import PreparedSubmit
    from orchestrator.ledger.store import ControllerLease, Ledger

FOLLOW_POLL_S = 1.0
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class LocalJobs:
    """The jobs of `settings`' ledger, opened on first use (or `ledger`, when given)."""

    def __init__(self, settings: Settings, ledger: Ledger | None = None) -> None:
        self.settings = settings
        self._ledger = ledger

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            from orchestrator.ledger.store import Ledger, ledger_engine

            self._ledger = Ledger(ledger_engine(self.settings))
        return self._ledger

    def submit_dryrun(self, request: SubmitRequest) -> PreparedSubmit:
        """`commands.prepare_submit` of the request: the spec loaded, the plan made."""
        from orchestrator.control.verbs import commands

        prepared = commands.prepare_submit(
            self.settings, request.job_file, request.overrides(os.environ), fresh=request.fresh,
            measure_data=request.dry_run,
        )  # fmt: skip
        if request.no_wait and request.cluster is None and not request.dry_run:
            commands.refuse_a_queue(prepared)
        return dataclasses.replace(prepared, notify=request.notify) if request.notify else prepared

    def schedule(self, dryrun: PreparedSubmit) -> str:
        """`commands.submit_detached`: a background controller drives the job."""
        from orchestrator.control.verbs import commands

        return commands.submit_detached(self.settings, self.ledger, dryrun).job_id

    def describe(self, job_id: str) -> dict[str, Any]:
        from orchestrator.report.documents import job_document

        return job_document(self.ledger, self.settings, self.ledger.get_job(job_id))

    def list(self, view: View) -> dict[str, Any]:
        from orchestrator.ledger.measures import utcnow
        from orchestrator.ledger.view import LedgerView
        from orchestrator.report.documents import cost_from, status_list

        with LedgerView.of_engine(self.ledger.engine) as reads:
            if view == "cost":
                return cost_from(reads, reads.clusters, utcnow())
            jobs, _ = status_list(reads, self.settings.home, utcnow())
        from orchestrator.report.clusters import clusters_document

        return {"jobs": jobs, "clusters": clusters_document(self.ledger, utcnow(), up_only=True)}

    def cost(self, job_id: str) -> dict[str, Any]:
        from orchestrator.ledger.measures import utcnow
        from orchestrator.ledger.view import LedgerView
        from orchestrator.report.documents import cost_from
        from orchestrator.report.spot_choice import spot_auto_of

        with LedgerView.of_engine(self.ledger.engine) as reads:
            document = cost_from(reads, reads.clusters, utcnow(), job_id)
            document["spot_auto"] = spot_auto_of(
                reads, job_id, lambda: self.settings.local.price_per_hour
            )
        return document

    def cancel(self, job_id: str, *, force: bool, say: Say) -> CancelOutcome:
        from orchestrator.cluster.checkpoints.kept_summary import kept_phrase, newest_kept
        from orchestrator.control.verbs.cancel import cancel
        from orchestrator.ledger.measures import utcnow

        def signalled(pid: int) -> None:
            say(f"cancelling {job_id}: its controller stops the trainers and the nodes", False)

        def asked(lease: ControllerLease) -> None:
            say(f"cancelling {job_id}: asked its controller on machine {lease.machine} through "
                "the ledger; it stops the trainers and the nodes", False)  # fmt: skip

        def forced(lease: ControllerLease) -> None:
            say(f"warning: --force: took the lease of {job_id} from its controller on machine "
                f"{lease.machine}, which stops at its next renewal; its trainers get no SIGTERM "
                "and no checkpoint is pulled", True)  # fmt: skip

        result = cancel(self.settings, self.ledger, job_id, force=force, on_signalled=signalled,
                        on_asked=asked, on_forced=forced)  # fmt: skip
        kept = newest_kept(self.ledger.checkpoints(job_id, live_only=True))
        return CancelOutcome(
            route=result.route.value,
            state=result.state.value,
            terminated=len(result.terminated),
            kept=kept_phrase(kept, utcnow()),
        )

    def logs(self, request: LogsRequest, write: Callable[[str], None], say: Say) -> int:
        """The job's node logs as its controller mirrored them (rank 0's by default); the
        rotated files of a capped log first, oldest first; `follow` goes on across rotations
        until the job ends."""
        from orchestrator.cluster.log_lines import LogReader

        job = self.ledger.get_job(request.job_id)
        rank, node, all_ranks = request.rank, request.node, request.all_ranks
        if sum((rank is not None, node is not None, all_ranks)) > 1:
            raise SpecError("give one of --rank, --node and --all-ranks")
        ranks = job.nodes * job.gpus_per_node
        if rank is not None and not 0 <= rank < ranks:
            raise SpecError(f"--rank must be between 0 and {ranks - 1}")
        if node is not None and not 0 <= node < job.nodes:
            raise SpecError(f"--node must be between 0 and {job.nodes - 1}")
        # `launcher: none`: the run's own output carries no rank prefix: the node's whole log.
        whole = node is not None or json.loads(job.spec_json or "{}").get("launcher") == "none"
        wanted = rank or 0
        if all_ranks:
            nodes = list(range(job.nodes))
        else:
            nodes = [node if node is not None else wanted // job.gpus_per_node]
        logs = self.settings.job_dir(job.id) / "logs"
        readers = [LogReader(logs / f"node-{n}.log", n, job.gpus_per_node) for n in nodes]
        since = request.since

        def keep(line: LogLine) -> bool:
            if since is not None and (line.at is None or line.at < since):
                return False
            return all_ranks or whole or line.rank == wanted

        render = _renderer(request, whole)
        first = True
        while True:
            done = not request.follow or JobState(self.ledger.get_job(job.id).state).is_final
            batch = [line for reader in readers for line in reader.read(final=done) if keep(line)]
            if len(readers) > 1:  # the nodes' lines in the order they were pulled
                batch.sort(key=lambda line: line.at or _NO_TIME)
            if first and request.tail is not None:
                batch = batch[-request.tail :] if request.tail else []
            first = False
            write("".join(render(line) + "\n" for line in batch))
            if done:
                break
            time.sleep(FOLLOW_POLL_S)
        if not any(reader.seen for reader in readers):
            which = "any node" if all_ranks else f"node {nodes[0]}"
            say(f"no log of {which} yet (logs arrive with the controller's next watch tick)", True)
        return 0


def _renderer(request: LogsRequest, whole: bool) -> Callable[[LogLine], str]:
    if request.json_out:
        return _json_line
    if request.all_ranks:
        return _ranked
    return (lambda line: line.raw) if whole else (lambda line: line.text)


def _json_line(line: LogLine) -> str:
    return json.dumps(
        {
            "node": line.node,
            "rank": line.rank,
            "line": line.text,
            "time": line.at.isoformat() if line.at else None,
        }
    )


def _ranked(line: LogLine) -> str:
    who = f"rank {line.rank}" if line.rank is not None else f"node {line.node}"
    return f"[{who}] {line.text}"
