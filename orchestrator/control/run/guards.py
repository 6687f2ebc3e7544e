"""The runner's side of the nodes' guards (see orchestrator.node.guard): the terms they are
launched with, the leases they are fed, and what it means when they ended their nodes.

Leases are signed with the Ed25519 key the controller reaches the job's nodes with (its
`ORCH_HOME/keys/<id>/`, which a controller that adopts the job has too); the terms carry its
public half, so a lease that job code writes on a node does not verify. Their times are on
each node's own clock: every renewal reads it, and a node not read yet is read first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from orchestrator.control.money.stop_rules import STALLED_EXIT, StopOrder, guard_limit_at
from orchestrator.control.money.team_caps import TeamCaps
from orchestrator.control.run.attempt import Answer, Attempt
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter, RunnerOptions
from orchestrator.errors import OrchError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import hourly_rate, total_cost, utcnow
from orchestrator.node.guard_protocol import (
    GuardLayout,
    GuardLease,
    GuardTerms,
    cleared_lease,
    clock_command,
    lease_until,
    parse_clock,
    parse_status,
    renew_command,
    status_command,
)
from orchestrator.node.run_progress import ORPHANED
from orchestrator.providers.base import Instance, NodeEnd, Provider
from orchestrator.remote.keys import Identity, ensure_identity
from orchestrator.spec.model import JobSpec

GUARD_START_WAIT_S = 10.0  # how long a guard that has not written its status yet may take
GUARD_START_POLL_S = 0.25


class Guards:
    """What the controller tells the nodes' guards, and hears of them."""

    def __init__(
        self,
        journal: Journal,
        spec: JobSpec,
        options: RunnerOptions,
        provider: Provider,
        reporter: Reporter,
        *,
        keys: Path,
        team: TeamCaps | None = None,
    ) -> None:
        self.journal = journal
        self.ledger = journal.ledger
        self.spec = spec
        self.options = options
        self.provider = provider
        self.reporter = reporter
        self.team = team  # the monthly caps the job is under (None: none)
        self.autostop_s: float | None = None  # a kept cluster's (set by the runner)
        self.keys = keys  # the folder of the key the job's nodes are reached with
        self.clock_offsets: dict[str, float] = {}  # node's clock - ours (s), by instance id
        self.lease_offsets: dict[str, float] = {}  # ... as the last lease sent there used it
        self._sign: Callable[[bytes], bytes] | None = None

    def terms(self, pull_wait: float, beside: Sequence[Instance] = ()) -> GuardTerms:
        """The job's limits for the guards of the nodes about to be launched, `beside` the
        nodes that stay (the survivors of a partial replacement).

        max_runtime counts from the job's start (its first RUNNING); before that, from now,
        which is earlier than any start: the guard never acts later than the controller would.
        Once the job has started, that deadline is also the nodes' ceiling, which no lease
        lifts. The budget is what is left of `max_cost_usd` now, spent at the launch's and
        `beside`'s rate (also a ceiling); under monthly caps, what is left of each this month,
        spent at its open leases' rate plus the launch's own nodes'."""
        job, budget, options = self.journal.job, self.spec.budget, self.options
        now = utcnow()
        deadline = None
        if budget.max_runtime is not None:
            deadline = (job.started_at or now) + timedelta(seconds=budget.max_runtime)
        left = None
        if budget.max_cost_usd is not None:
            left = budget.max_cost_usd - self.ledger.spend(job.id, now)
        kept = job.cluster_id is not None
        others = sum((i.price_per_hour for i in beside), Decimal(0))
        return GuardTerms(
            job_id=job.node_owner,
            interval_s=options.watch_interval,
            silence_s=max(10.0, 3 * options.watch_interval),
            allowance_s=options.stop_grace + pull_wait + options.stop_allowance + 30.0,
            deadman_s=self.autostop_s if kept else options.deadman_timeout,
            stop_grace_s=options.stop_grace,
            upload_wait_s=pull_wait if self.spec.checkpoint.store else 0.0,
            idle_util_pct=options.idle_util_pct,
            idle_cpu_pct=options.idle_cpu_pct,
            runtime_deadline=deadline,
            budget_left_usd=left,
            idle_timeout_s=budget.idle_timeout,
            stop_allowance_s=options.stop_allowance,
            autostop=kept,
            shared_budgets=self.team.shared_budgets(job) if self.team else (),
            lease_key=self._identity().public_key,
            start_timeout_s=self.spec.recovery.start_timeout,
            stall_timeout_s=budget.stall_timeout,
            progress_pattern=self.spec.progress.pattern,
            runtime_ceiling=deadline if job.started_at is not None else None,
            others_hourly_usd=others,
            transfer_hold_s=options.push_timeout,
            notice_interval_s=options.notice_poll_interval,
        )

    def check(self, attempt: Attempt) -> None:
        """Record whether every node's guard is armed and can power its node off; a guard that
        cannot act is a warning (the controller's own limits still hold while it lives).

        A node can answer SSH before its boot has started the guard (cloud-init runs a node's
        user data after sshd is up): a guard that has written nothing yet is asked again for
        up to `GUARD_START_WAIT_S` before it counts as missing. A guard that reports a problem
        counts at once."""
        layout = GuardLayout(self.journal.job.node_owner)
        deadline = time.monotonic() + GUARD_START_WAIT_S
        while True:
            try:
                statuses = [parse_status(text) for text in attempt.read(status_command(layout))]
            except OrchError as exc:
                self.journal.event("WARNING", f"could not read the guards: {exc}")
                return
            starting = any(not s.armed and not s.problem for s in statuses)
            if not starting or time.monotonic() >= deadline:
                break
            time.sleep(GUARD_START_POLL_S)
        problems = [
            f"node {rank}: " + (status.problem or "no guard runs")
            for rank, status in enumerate(statuses)
            if not status.armed or status.problem
        ]
        if problems:
            text = "; ".join(problems)
            self.journal.event(
                "WARNING", f"a guard cannot end its node without the controller: "
                f"{text}; keep this controller running, or fix the node's poweroff (sudo -n)",
            )  # fmt: skip
            self.reporter.line(f"[orch] warning: guard: {text}")
        else:
            self.journal.event("GUARDED", self._summary(len(statuses)))

    def _summary(self, nodes: int) -> str:
        budget = self.spec.budget
        limits = [
            f"max_runtime {budget.max_runtime:.0f} s" if budget.max_runtime else "",
            f"budget lease on ${budget.max_cost_usd}" if budget.max_cost_usd is not None else "",
            "budget lease on the monthly caps" if self.team is not None else "",
            f"idle {budget.idle_timeout:.0f} s" if budget.idle_timeout else "",
            f"stall {budget.stall_timeout:.0f} s" if budget.stall_timeout else "",
            f"start {start:.0f} s" if (start := self.spec.recovery.start_timeout) else "",
        ]
        named = ", ".join(limit for limit in limits if limit) or "no limit: training runs on"
        if self.journal.job.cluster_id is None:
            last = f"dead-man {self.options.deadman_timeout:.0f} s"
        elif self.autostop_s is None:
            last = "kept cluster: no autostop"
        else:
            last = f"kept cluster: autostop after {self.autostop_s:.0f} s idle"
        return f"guards armed on {nodes} node(s): {named}; {last}"

    def _lease(self, now: datetime) -> GuardLease:
        """The lease the nodes get now: the run's deadline, and how long the rest of the
        budget lasts at the open leases' prices; under monthly caps, never past the moment the
        first of them would be passed at its total rate (every job's open leases in it)."""
        job, budget = self.journal.job, self.spec.budget
        deadline = None
        if budget.max_runtime is not None:  # before the first start: the start about to be
            deadline = (job.started_at or now) + timedelta(seconds=budget.max_runtime)
        until = None
        if budget.max_cost_usd is not None:
            leases = self.ledger.leases(job.id)
            hourly = hourly_rate(leases)
            until = lease_until(
                now=now,
                budget_left_usd=budget.max_cost_usd - total_cost(leases, now),
                hourly_usd=hourly,
                reserve_s=self.options.stop_grace + self.options.stop_allowance,
            )
        if self.team is not None:
            shared = self.team.lease_until(
                job, reserve_s=self.options.stop_grace + self.options.stop_allowance, now=now
            )
            until = min((end for end in (until, shared) if end is not None), default=None)
        return GuardLease(
            renewed_at=now, runtime_deadline=deadline, lease_until=until,
            idle_timeout_s=budget.idle_timeout, job_limits=job.cluster_id is not None,
            autostop_s=self.autostop_s, start_timeout_s=self.spec.recovery.start_timeout,
            stall_timeout_s=budget.stall_timeout, progress_pattern=self.spec.progress.pattern,
        )  # fmt: skip

    def renew(self, attempt: Attempt) -> None:
        """Write the lease to every node that answers (best effort: a node that misses it
        keeps its last lease, which never reaches past the budget)."""
        if attempt.connected:
            self._send(attempt, self._lease(utcnow()))

    def clear(self, attempt: Attempt) -> None:
        """A kept cluster's job let it go: every node's lease loses the job's limits, and its
        autostop counts from now."""
        self._send(attempt, cleared_lease(utcnow(), self.autostop_s))

    def _send(self, attempt: Attempt, lease: GuardLease) -> None:
        """Sign `lease` for each node, its times on that node's clock, and write it there."""
        owner = self.journal.job.node_owner
        ids = [instance.instance_id for instance in attempt.instances]
        gone = attempt.gone_ranks
        if any(rank not in gone and i not in self.clock_offsets for rank, i in enumerate(ids)):
            self._read_clocks(attempt, attempt.each_node(clock_command()))
        sign = self._signer()
        # A node whose clock could not be read gets ours: it answered nothing, and most
        # likely misses the lease too.
        offsets = [self.clock_offsets.get(instance_id, 0.0) for instance_id in ids]
        answers = attempt.each_node(
            renew_command(GuardLayout(owner)),
            lambda rank: lease.for_node(job_id=owner, clock_offset_s=offsets[rank], sign=sign),
        )
        self.lease_offsets.update((ids[rank], offsets[rank]) for rank in answers)
        self._read_clocks(attempt, answers)

    def _read_clocks(self, attempt: Attempt, answers: dict[int, Answer]) -> None:
        for rank, answer in answers.items():
            offset = parse_clock(answer.output, answer.sent_ns, answer.received_ns)
            if offset is not None:
                self.clock_offsets[attempt.instances[rank].instance_id] = offset

    def _identity(self) -> Identity:
        return ensure_identity(self.keys, f"orch-{self.journal.job.node_owner}")

    def _signer(self) -> Callable[[bytes], bytes]:
        """The Ed25519 signing of the job's key (the one its nodes are reached with)."""
        if self._sign is None:
            key = load_ssh_private_key(self._identity().private_key.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise OrchError(f"the key in {self.keys} is not Ed25519: it cannot sign leases")
            self._sign = key.sign
        return self._sign

    def ended_by_guard(self, instance_ids: tuple[str, ...]) -> StopOrder | None:
        """The stop for nodes that powered themselves off: their guard acted on a limit, so
        the job ends as that limit says instead of launching new nodes. Their leases close at
        the time the provider says they ended. Nodes that only followed rank 0's node (their
        run's master closed) decide nothing: None when they are all there is."""
        if not instance_ids:
            return None
        ended = self.provider.self_ended(list(instance_ids))
        if not ended:
            return None
        self.close_self_ended(ended)
        # A node that followed rank 0's (its run's master closed) tells no limit of its own:
        # the job ends as rank 0's guard said, and with no word from it, the nodes were lost.
        deciding = [end for end in ended.values() if end.kind != ORPHANED]
        if not deciding:
            return None
        first = min(deciding, key=lambda end: end.at or utcnow())
        words = f"node(s) {', '.join(sorted(ended))} powered themselves off: {first.message}"
        kind = first.kind or self._limit_behind(first.at or utcnow())
        states = {
            "max_runtime": (JobState.TIMED_OUT, 1),
            "budget": (JobState.BUDGET_STOPPED, 4),
            "idle": (JobState.IDLE_STOPPED, 1),
            "stall": (JobState.STALLED, STALLED_EXIT),
        }
        state, code = states.get(kind, (JobState.FAILED, 1))
        if not first.kind and kind:
            words += f" (by the job's limits at that time: {kind})"
        if kind in ("deadman", "autostop"):
            words += " (the run had ended while no controller watched; its exit code is lost)"
        return StopOrder(state, code, words)

    def _limit_behind(self, at: datetime) -> str:
        """Which limit a guard most likely acted on when nodes powered themselves off at `at`
        and the provider cannot say why (EC2 keeps no word of it)."""
        job, budget = self.journal.job, self.spec.budget
        leases = self.ledger.leases(job.id)
        hourly = hourly_rate(leases)
        if self.team is not None and self._monthly_cap_reached(self.team, at):
            return "budget"
        return guard_limit_at(
            at=at,
            started_at=job.started_at,
            max_runtime_s=budget.max_runtime,
            spend=total_cost(leases, at),
            max_cost=budget.max_cost_usd,
            reserve_usd=hourly
            * Decimal(str(self.options.stop_grace + self.options.stop_allowance))
            / 3600,
            idle_timeout_s=budget.idle_timeout,
            stall_timeout_s=budget.stall_timeout,
        )

    def _monthly_cap_reached(self, team: TeamCaps, at: datetime) -> bool:
        """Whether a monthly cap's spend at `at`, plus what its rate bills during a stop, had
        reached the cap (its guards' lease had run out)."""
        reserve_s = self.options.stop_grace + self.options.stop_allowance
        return any(
            f.spent_usd + f.hourly_usd * Decimal(str(reserve_s)) / 3600 >= f.cap_usd
            for f in team.figures(self.journal.job.owner, at)
        )

    def close_self_ended(self, ended: dict[str, NodeEnd]) -> None:
        """Close the leases of nodes that ended themselves, at the time they did."""
        for instance_id, end in ended.items():
            if end.at is not None:
                self.ledger.close_leases([instance_id], end.at)
