"""Crash trials on `orch sandbox aws`: `kill -9` the controller of a detached `--provider aws`
job at seeded random moments, then `orch reconcile`, and check that nothing leaks.

    python -m tests.support.sandbox_crash_trials --trials 10 [--seed 11] [--phase running]
        [--keep DIR]

One sandbox serves every trial; each trial has an ORCH_HOME and an `aws.owner` of its own. A
trial submits a detached spot job (2 nodes, torchrun running `tests/fixtures/step_counter.py`)
and waits for its phase: launching (PROVISIONING, from the job's first RunInstances on), syncing
(SYNCING), running (RUNNING, from step 2 on), recovering (from the PREEMPTED event that follows
a sandbox reclaim of node 1 with a short notice, through RECOVERING and the replacements'
launch) or tearing down (after `orch cancel`, STOPPING towards CANCELLED). A seeded moment into
the phase (a kill that lands in another state misses it) it SIGKILLs the controller (pid from
`jobs/<id>/controller.pid`), runs `orch reconcile`, which gives the job a new controller that
adopts it, and lets the job end. Checked, right after the reconcile and at the end:

- moto runs no instance that no live job owns (a job that is not final and whose controller
  holds its lock), and none at all once the job has ended; the hosts of ended instances are gone;
- every lease is closed or owned by a live job, and the ledger passes `check_ledger`;
- no duplicate launches: every ClientToken launched one instance; each launch attempt (found
  back from the tokens) made at most one instance per node rank, and every instance of the job
  has exactly one lease (no node billed off the books);
- the job ends SUCCEEDED at its last step (exit code 0), or CANCELLED (130) when the kill came
  while tearing down.

Prints one row per trial; exits 1 when a trial found a problem or missed its phase.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from orchestrator.config import load_settings
from orchestrator.control.process.controllers import controller_running
from orchestrator.job_state import JobState
from orchestrator.ledger.check import check_ledger
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.providers.aws.ec2_requests import (
    TAG_LEDGER,
    TAG_OWNER,
    TAG_TOKEN,
    client_token,
    tags_of,
)
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.offers import Offer
from orchestrator.sandbox.client import SandboxClient
from tests.support import kill_trials
from tests.support.helpers import ORCH, REPO, fast_env, processes_with_marker, run_orch
from tests.support.kill_trials import (
    TrialFailed,
    TrialJob,
    TrialPlan,
    end_problems,
    kill_controller,
    leftover_processes,
    trials_main,
    wait_job,
    wait_revived,
)
from tests.support.leak_checks import controller_processes
from tests.support.sandbox_run import (
    NETNS_PREFIX,
    SandboxProcess,
    aws_env,
    sandbox_namespaces,
    sandbox_turn,
)
from tests.support.waiting import wait_until

PHASES = ("launching", "syncing", "running", "recovering", "tearing down")
# Upper bound of the kill moment, seconds into the phase (each lasts at least that long here).
# Launching counts from the first RunInstances of the job: a kill before it leaves nothing to
# clean up, one after it cuts the launch short while the nodes boot.
WINDOW_S = {
    "launching": 1.0,
    "syncing": 0.5,
    "running": 3.0,
    "recovering": 4.0,
    "tearing down": 0.5,
}
# The job states a kill may land in for the trial to count (else it missed its phase).
PHASE_STATES = {
    "launching": {JobState.PROVISIONING},
    "syncing": {JobState.SYNCING},
    "running": {JobState.RUNNING},
    "recovering": {JobState.RUNNING, JobState.RECOVERING, JobState.PROVISIONING,
                   JobState.SYNCING},
    "tearing down": {JobState.STOPPING},
}  # fmt: skip
EXPECTED = {phase: JobState.SUCCEEDED for phase in PHASES} | {"tearing down": JobState.CANCELLED}
EXIT_CODES = {JobState.SUCCEEDED: 0, JobState.CANCELLED: 130}
LIVE = ("pending", "running")

STEPS = 40
# 32 MiB of data, sparse here but sent in full: the sync lasts a moment
JOB = TrialJob(steps=STEPS, step_s=0.2, checkpoint_every=4, data_bytes=32 * 1024 * 1024)
STOP_S = 2.0  # the emergency checkpoint's time when cancelled: outlasts the tearing-down window
NOTICE_S = 3


def plan_trials(count: int, seed: int, phases: tuple[str, ...] = PHASES) -> list[TrialPlan]:
    """`count` trials cycling through `phases`, each with a seeded moment in its window (each
    revived by `orch reconcile`)."""
    return kill_trials.plan_trials(count, seed, phases, WINDOW_S)


@dataclass
class TrialResult:
    plan: TrialPlan
    job_id: str = ""
    killed_in: str = "-"
    final_state: str = "-"
    step: int | None = None
    recoveries: int = 0
    instances: int = 0
    leases: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def hit_phase(self) -> bool:
        """The kill landed in the phase the trial aimed at."""
        return self.killed_in != "-" and "missed" not in self.killed_in

    @property
    def ok(self) -> bool:
        return self.hit_phase and not self.problems

    def row(self) -> str:
        outcome = f"{self.final_state} step {self.step} rec {self.recoveries}"
        found = "none" if not self.problems else "; ".join(self.problems)
        return (
            f"{self.plan.number:>5}  {self.plan.phase:<12} {self.plan.moment_s:>6.2f}  "
            f"{self.killed_in:<22} {outcome:<26} {self.instances:>4}/{self.leases:<4} "
            f"{self.seconds:>5.0f}  {found}"
        )


HEADER = (
    f"{'trial':>5}  {'phase':<12} {'moment':>6}  {'killed in':<22} {'outcome':<26} "
    f"{'inst/lease':>9} {'s':>5}  problems"
)


def table(results: Sequence[TrialResult]) -> str:
    return "\n".join([HEADER, *(result.row() for result in results)])


# --- one trial ------------------------------------------------------------------------------


def trial_env(home: Path, endpoint: str) -> dict[str, str]:
    return fast_env(home, **aws_env(endpoint))


def _training(job: Job) -> bool:
    return job.state == JobState.RUNNING and (job.step or 0) >= 2


class Trial:
    """One trial against a running sandbox; `run()` never raises for what it finds."""

    def __init__(self, plan: TrialPlan, directory: Path, sandbox: SandboxProcess) -> None:
        self.plan = plan
        self.directory = directory
        self.sandbox = sandbox
        self.home = directory / "orch"
        self.owner = f"crash-{plan.number:02d}"
        self.env = trial_env(self.home, sandbox.endpoint)
        self.result = TrialResult(plan)
        self.ec2 = sandbox.ec2()

    def run(self, log: Callable[[str], None]) -> TrialResult:
        started = time.monotonic()
        helper: subprocess.Popen[str] | None = None
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            # An owner of its own: the trial's reconcile sees only the trial's instances.
            (self.home / "config.yaml").write_text(
                f"aws: {{owner: {self.owner}, poll_interval_s: 0.5}}\n"
            )
            settings = load_settings(self.env)
            spec = JOB.write(self.directory, STOP_S if self.plan.phase == "tearing down" else 0.0)
            submitted = run_orch(
                ["submit", str(spec), "--provider", "aws", "--detach", "--yes"],
                self.env,
                timeout=120,
            )
            if submitted.returncode != 0:
                raise TrialFailed(f"submit failed: {submitted.stdout}{submitted.stderr}")
            job_id = self.result.job_id = submitted.stdout.strip().splitlines()[-1]
            ledger = Ledger(make_engine(settings.db_path))
            helper = self._reach_phase(ledger, job_id)
            time.sleep(self.plan.moment_s)  # the trial's seeded moment into the phase
            kill_controller(self.home, job_id)
            job = ledger.get_job(job_id)
            self.result.killed_in = job.state + (
                " (missed)" if job.state not in PHASE_STATES[self.plan.phase]
                else " (noticed)" if self.plan.phase == "recovering" and job.state == "RUNNING"
                else ""
            )  # fmt: skip
            log(f"trial {self.plan.number}: killed the controller of {job_id} in {job.state}")

            revived = run_orch(["reconcile"], self.env, timeout=120)
            if revived.returncode != 0:
                raise TrialFailed(f"orch reconcile failed: {revived.stdout}{revived.stderr}")
            wait_revived(settings, ledger, job_id)
            self._check(settings, ledger, job_id, when="after reconcile")

            job = wait_job(
                ledger, job_id, lambda j: JobState(j.state).is_final, "the end", timeout=400
            )
            if helper is not None:
                helper.communicate(timeout=120)
            for pid in leftover_processes(self.home):
                self.result.problems.append(f"orch process {pid} still runs after the end")
            job = ledger.get_job(job_id)
            self.result.final_state, self.result.step = job.state, job.step
            self.result.recoveries = job.recoveries
            self.result.problems += end_problems(job, EXPECTED[self.plan.phase], STEPS)
            if job.state in EXIT_CODES and job.exit_code != EXIT_CODES[JobState(job.state)]:
                self.result.problems.append(f"ended {job.state} with exit code {job.exit_code}")
            self._check(settings, ledger, job_id, when="at the end")
        except (TrialFailed, subprocess.TimeoutExpired, OSError) as exc:
            self.result.problems.append(f"trial failed: {exc}")
        finally:
            if helper is not None and helper.poll() is None:
                helper.kill()
                helper.wait()
            self._end_everything()
            self.result.seconds = time.monotonic() - started
        return self.result

    def _reach_phase(self, ledger: Ledger, job_id: str) -> subprocess.Popen[str] | None:
        """Wait until the job is in the trial's phase; returns a helper command still running."""
        phase = self.plan.phase
        if phase == "launching":
            wait_job(
                ledger, job_id,
                lambda j: j.state == JobState.PROVISIONING and bool(self._instances(job_id)),
                "its first RunInstances", 120,
            )  # fmt: skip
        elif phase == "syncing":
            wait_job(ledger, job_id, lambda j: j.state == JobState.SYNCING, phase, 120)
        elif phase == "running":
            wait_job(ledger, job_id, _training, "step 2", 240)
        elif phase == "recovering":
            wait_job(ledger, job_id, _training, "step 2", 240)
            node1 = next(lease for lease in ledger.leases(job_id) if lease.rank == 1)
            SandboxClient(self.sandbox.endpoint).preempt(node1.instance_id, NOTICE_S)
            wait_job(
                ledger, job_id,
                lambda j: any(e.kind == "PREEMPTED" for e in ledger.events(job_id)),
                "the notice", 60,
            )  # fmt: skip
        else:  # `orch cancel` takes seconds to start: asked as soon as the run starts
            wait_job(ledger, job_id, lambda j: j.state == JobState.RUNNING, "the run", 240)
            helper = subprocess.Popen(
                [*ORCH, "cancel", job_id], env=self.env, cwd=REPO, text=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            wait_job(
                ledger, job_id,
                lambda j: j.state == JobState.STOPPING and j.stop_state == JobState.CANCELLED,
                "the stop `orch cancel` asked for", 60,
            )  # fmt: skip
            return helper
        return None

    # --- checks -------------------------------------------------------------------------------

    def _instances(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Every instance of this trial's owner (and of `job_id`, when given), in any state."""
        filters = [{"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]}]
        if job_id is not None:
            filters.append({"Name": "tag:orch-job", "Values": [job_id]})
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _check(self, settings: Any, ledger: Ledger, job_id: str, *, when: str) -> None:
        job = ledger.get_job(job_id)
        live_job = not JobState(job.state).is_final and controller_running(settings, job_id)
        instances = self._instances()
        problems: list[str] = []
        for desc in instances:
            tags = tags_of(desc)
            if desc["State"]["Name"] in LIVE and not (tags.get("orch-job") == job_id and live_job):
                problems.append(f"{desc['InstanceId']} runs and no live job owns it")
        found = check_ledger(
            settings.db_path, watched=lambda j: controller_running(settings, j)
        )  # fmt: skip
        problems += [f"ledger: {line}" for line in found.integrity + found.problems]
        problems += self._duplicates(ledger, job, instances)
        if when == "at the end":
            problems += self._host_leaks(instances)
            self.result.instances = len(instances)
            self.result.leases = len(ledger.leases(job_id))
        self.result.problems += [f"{when}: {p}" for p in problems]

    def _duplicates(self, ledger: Ledger, job: Job, instances: list[dict[str, Any]]) -> list[str]:
        problems = []
        tokens = Counter(tags_of(d).get(TAG_TOKEN, "") for d in instances)
        for token, count in tokens.items():
            if count > 1:
                problems.append(f"{count} instances launched with one ClientToken {token[:16]}")
        leases = Counter(lease.instance_id for lease in ledger.leases(job.id))
        for desc in instances:
            iid = desc["InstanceId"]
            if desc["State"]["Name"] in LIVE and leases[iid] == 0:
                continue  # being launched right now: its lease comes once the launch returns
            if leases[iid] != 1:
                problems.append(f"{iid} has {leases[iid]} lease(s), not 1")
        ranks: dict[int, list[int]] = defaultdict(list)
        for desc in instances:
            attempt = launch_attempt(job, desc)
            if attempt is None:
                problems.append(f"{desc['InstanceId']}: its token matches no launch attempt")
            else:
                ranks[attempt].append(int(tags_of(desc).get("orch-node-rank", "-1")))
        for attempt, seen in sorted(ranks.items()):
            if len(seen) != len(set(seen)) or len(seen) > job.nodes:
                problems.append(f"launch attempt {attempt} made nodes of ranks {sorted(seen)}")
        return problems

    def _host_leaks(self, instances: list[dict[str, Any]]) -> list[str]:
        problems = []
        client = SandboxClient(self.sandbox.endpoint)
        ids = {d["InstanceId"] for d in instances}

        def hosts() -> set[str]:
            return {h["instance_id"] for h in client.status()["hosts"]}

        with contextlib.suppress(TrialFailed):  # the sandbox ends a host within a pass or two
            wait_until(lambda: not hosts() & ids, "the hosts' end", 10, interval=0.3,
                       fail=TrialFailed)  # fmt: skip
        left = hosts()
        namespaces = sandbox_namespaces()
        for desc in instances:
            iid = desc["InstanceId"]
            if iid in left or NETNS_PREFIX + iid in namespaces:
                problems.append(f"the host of {iid} is still there")
            if processes_with_marker(iid):
                problems.append(f"processes of {iid} remain")
        return problems

    def _end_everything(self) -> None:
        """The safety net: the trial's orch processes killed, its live instances terminated."""
        for pid in controller_processes(self.home):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            live = [d["InstanceId"] for d in self._instances() if d["State"]["Name"] in LIVE]
            if live:
                self.ec2.terminate_instances(InstanceIds=live)


def launch_attempt(job: Job, desc: dict[str, Any], limit: int = 64) -> int | None:
    """The launch attempt an instance belongs to, found by recomputing the provider's
    ClientToken for each attempt (the token is a hash of ledger, job, attempt, rank and
    offer)."""
    tags = tags_of(desc)
    rank = int(tags.get("orch-node-rank", "0"))
    offer = Offer(
        instance_type=desc["InstanceType"], region="", zone=desc["Placement"]["AvailabilityZone"],
        market=tags.get("orch-market", "spot"),  # type: ignore[arg-type]
        price_per_hour=Decimal(0), on_demand_price=Decimal(0), gpu="", gpus=0,
        gpu_memory_gib=0.0, vcpus=0, memory_gib=0.0,
    )  # fmt: skip
    for attempt in range(limit):
        request = LaunchRequest(
            job_id=job.id, cluster=job.id, count=job.nodes, gpus_per_node=job.gpus_per_node,
            public_key="", attempt=attempt, ledger_id=tags.get(TAG_LEDGER),
        )  # fmt: skip
        if client_token(request, rank, offer) == tags.get(TAG_TOKEN):
            return attempt
    return None


# --- many trials ----------------------------------------------------------------------------


def run_trials(
    plans: list[TrialPlan], base: Path, *, log: Callable[[str], None] = print
) -> list[TrialResult]:
    """Start one sandbox (its home under `base`), run every trial in it, stop it; what the
    sandbox printed is left in `base/sandbox.log`. Waits for its turn (`sandbox_turn`)."""
    with sandbox_turn():
        return _run_trials(plans, base, log)


def _run_trials(
    plans: list[TrialPlan], base: Path, log: Callable[[str], None]
) -> list[TrialResult]:
    sandbox = SandboxProcess(base / "sandbox-home").start()
    results = []
    try:
        for plan in plans:
            directory = base / f"trial-{plan.number:02d}"
            directory.mkdir(parents=True, exist_ok=True)
            result = Trial(plan, directory, sandbox).run(log)
            log(result.row())
            results.append(result)
    finally:
        code = sandbox.stop()
        (base / "sandbox.log").write_text(
            sandbox.output
        )  # what the sandbox said, for a post-mortem
        if code != 0:
            log(f"the sandbox exited with {code}:\n{sandbox.output[-2000:]}")
    return results


def main(argv: list[str] | None = None) -> int:
    def run(phases: Sequence[str], count: int, seed: int, base: Path) -> list[TrialResult]:
        plans = plan_trials(count, seed, tuple(phases))
        return run_trials(plans, base, log=lambda text: print(text, flush=True))

    return trials_main(
        argv, prog="python -m tests.support.sandbox_crash_trials", doc=__doc__, phases=PHASES,
        trials=10, seed=11, run=run, table=table,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
