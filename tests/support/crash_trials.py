"""Crash trials: `kill -9` a job's controller at seeded random moments across the job's phases,
then check that the next orch command puts everything right.

    python -m tests.support.crash_trials --trials 20 [--seed 8] [--phase running] [--keep DIR]

Each trial submits a detached job (the step counter under torchrun, spot, 2 nodes) under an
ORCH_HOME of its own and waits for the trial's phase: provisioning, sync, running, recovery
(node 1 reclaimed at rank 0's first progress report, as `orch local preempt` does; kill while
the recovery is under way: RECOVERING, then PROVISIONING and SYNCING of the replacement beside
the node that stays) or teardown (SIGTERM to the controller then, as `orch cancel` does; kill
while the job is STOPPING). Both are done in-process, so they land at once, mid-training,
however long a CLI takes to start on a busy machine. A seeded random moment into the phase it
SIGKILLs the controller (pid from `jobs/<id>/controller.pid`), runs `orch status JOB` or
`orch reconcile` (both revive the controller), lets the job finish and checks:

- nothing of the job's nodes is left: no process, network namespace, veth or node record, and
  no bridge without nodes (`tests.support.leak_checks.host_leaks`);
- every lease is closed or belongs to a live job whose controller holds its lock (right after
  the revive and at the end), no launch was duplicated (never two leases of one rank at once,
  never more than the job's nodes) and every node that was billed has a lease
  (`lease_problems`);
- the ledger passes SQLite's integrity check and the ledger's invariants (`ledger_problems`);
- the job ends SUCCEEDED at its last step (kills during provisioning, sync, running, recovery)
  or CANCELLED, the state the stop was heading for (kills during teardown).

Prints one row per trial; exits 1 when a trial found a problem or missed its phase.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import Settings, load_settings
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine, utcnow
from orchestrator.providers.local.provider import LocalProvider
from tests.support import kill_trials
from tests.support.helpers import ORCH, REPO, fast_env, run_orch
from tests.support.kill_trials import (
    TrialFailed,
    TrialJob,
    TrialPlan,
    controller_pid,
    end_problems,
    kill_controller,
    leftover_processes,
    trials_main,
    wait_job,
    wait_revived,
)
from tests.support.leak_checks import (
    NodeSightings,
    controller_processes,
    host_leaks,
    lease_problems,
    ledger_problems,
)
from tests.support.waiting import wait_until

PHASES = ("provisioning", "sync", "running", "recovery", "teardown")
PHASE_STATE = {
    "provisioning": JobState.PROVISIONING,
    "sync": JobState.SYNCING,
    "running": JobState.RUNNING,
    "recovery": JobState.RECOVERING,
    "teardown": JobState.STOPPING,
}
# The states a kill may land in and still be in its phase. A recovery that keeps the surviving
# node is RECOVERING only while the lost node ends and the survivor's run stops (a fraction of a
# second); it goes on through PROVISIONING and SYNCING of the replacement.
PHASE_STATES = {phase: (state,) for phase, state in PHASE_STATE.items()} | {
    "recovery": (JobState.RECOVERING, JobState.PROVISIONING, JobState.SYNCING)
}
# Upper bound of the kill moment, seconds into the phase: each phase lasts at least this long
# on an idle machine, so the kill lands inside it.
WINDOW_S = {"provisioning": 0.3, "sync": 0.3, "running": 4.0, "recovery": 0.15, "teardown": 0.5}
EXPECTED = {phase: JobState.SUCCEEDED for phase in PHASES} | {"teardown": JobState.CANCELLED}
REVIVERS = ("status", "reconcile")
REVIVED_SAYS = {"status": "a new one adopted the job", "reconcile": "it got a new one"}

TARGET_STEP = 48
# 7 s of training (long enough for the running and recovery phases); 64 MiB of data, sparse,
# make the sync phase last a moment
JOB = TrialJob(steps=TARGET_STEP, step_s=0.15, checkpoint_every=2, data_bytes=64 * 1024 * 1024)
STOP_S = 2.0  # the emergency checkpoint's time in teardown trials: outlasts the window


def plan_trials(count: int, seed: int, phases: tuple[str, ...] = PHASES) -> list[TrialPlan]:
    """`count` trials cycling through `phases`, with seeded moments and revivers."""
    return kill_trials.plan_trials(count, seed, phases, WINDOW_S, REVIVERS)


@dataclass
class TrialResult:
    plan: TrialPlan
    job_id: str = ""
    state_at_kill: str = "-"
    final_state: str = "-"
    recoveries: int = 0
    step: int | None = None
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def hit_phase(self) -> bool:
        return self.state_at_kill in PHASE_STATES[self.plan.phase]

    @property
    def ok(self) -> bool:
        return self.hit_phase and not self.problems

    def row(self) -> str:
        outcome = f"{self.final_state} step {self.step} rec {self.recoveries}"
        leaks = "none" if not self.problems else "; ".join(self.problems)
        killed = self.state_at_kill if self.hit_phase else f"{self.state_at_kill} (missed)"
        return (
            f"{self.plan.number:>5}  {self.plan.phase:<12} {self.plan.moment_s:>6.2f}  "
            f"{killed:<14} {self.plan.revive:<9} {outcome:<28} {self.seconds:>5.0f}  {leaks}"
        )


HEADER = (
    f"{'trial':>5}  {'phase':<12} {'moment':>6}  {'killed in':<14} {'revived':<9} "
    f"{'outcome':<28} {'s':>5}  leaks"
)


def table(results: Sequence[TrialResult]) -> str:
    return "\n".join([HEADER, *(result.row() for result in results)])


def trial_env(home: Path) -> dict[str, str]:
    return fast_env(home)


def _submitted(submit: subprocess.Popen[str], found: Callable[[], object], what: str) -> object:
    """`found()` once it holds; TrialFailed with the submit's output if the submit ended first."""

    def check() -> object:
        value = found()
        if not value and submit.poll() is not None:
            raise TrialFailed(f"submit made no {what}: {submit.communicate()[0][-400:]}")
        return value

    return wait_until(check, what, 60, interval=0.01, fail=TrialFailed)


def wait_ledger(path: Path, submit: subprocess.Popen[str]) -> Ledger:
    """The ledger once `orch submit` has made it (its schema complete: a job record is written
    after the ledger is opened), so that opening it here never races the submit's schema."""
    _submitted(submit, lambda: any(path.parent.glob("jobs/*/job.json")), "job record")
    return Ledger(make_engine(path))


def wait_job_id(ledger: Ledger, submit: subprocess.Popen[str]) -> str:
    """The id of the trial's job as soon as the submit registered it."""
    jobs = _submitted(submit, ledger.jobs, "job in the ledger")
    assert isinstance(jobs, list)
    return str(jobs[0].id)


def wait_phase(ledger: Ledger, job_id: str, phase: str, timeout: float = 240) -> None:
    """Wait until the job is in one of `phase`'s states (a recovery: once it began, which the
    job's recovery count tells); TrialFailed if it went through them unseen."""
    first, states = PHASE_STATE[phase], PHASE_STATES[phase]

    def inside(job: Job) -> bool:
        return job.state in states and (phase != "recovery" or job.recoveries >= 1)

    def entered() -> bool:
        job = ledger.get_job(job_id)
        if inside(job):
            return True
        if any(event.kind == first.value for event in ledger.events(job_id)):
            # The state is written just before its event: both may have landed between the
            # two reads above, so the job is asked once more before the phase counts as missed.
            if inside(ledger.get_job(job_id)):
                return True
            raise TrialFailed(f"missed {phase}: the job went through it unseen")
        if JobState(job.state).is_final:
            raise TrialFailed(f"the job ended {job.state} before it was {first.value}")
        return False

    wait_until(entered, f"the job to become {first.value}", timeout, interval=0.02,
               fail=TrialFailed)  # fmt: skip


def _training(job: Job) -> bool:
    """Rank 0 reported progress (the first report reaches the ledger at once)."""
    return job.state == JobState.RUNNING and (job.step or 0) >= 1


def orch_background(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ORCH, *args], env=env, cwd=REPO, text=True, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def reclaim_node_1(settings: Settings, ledger: Ledger, job_id: str) -> None:
    """Take node 1 of the job the way `orch local preempt JOB --node 1` does (no notice)."""
    (lease,) = [lease for lease in ledger.leases(job_id, open_only=True) if lease.rank == 1]
    if LocalProvider(settings).reclaim(lease.instance_id) is None:
        raise TrialFailed(f"node 1 ({lease.instance_id}) was gone before the reclaim")


def run_trial(
    plan: TrialPlan, directory: Path, *, log: Callable[[str], None] = print
) -> TrialResult:
    """Run one trial in `directory` (its ORCH_HOME is `directory/orch`); never raises for what
    the trial finds: problems go into the result."""
    started = time.monotonic()
    result = TrialResult(plan)
    home = directory / "orch"
    env = trial_env(home)
    settings = load_settings(env)
    spec = JOB.write(directory, STOP_S if plan.phase == "teardown" else 0.0)
    submit: subprocess.Popen[str] | None = None
    try:
        with NodeSightings(home) as sightings:
            submit = orch_background(["submit", str(spec), "--detach"], env)
            ledger = wait_ledger(settings.db_path, submit)
            job_id = result.job_id = wait_job_id(ledger, submit)
            target = PHASE_STATE[plan.phase]
            if plan.phase in ("recovery", "teardown"):
                wait_job(ledger, job_id, _training, "training", timeout=240)
                log(f"trial {plan.number}: {job_id} is training, {plan.phase} starts")
                if plan.phase == "recovery":
                    reclaim_node_1(settings, ledger, job_id)
                else:
                    os.kill(controller_pid(home, job_id), signal.SIGTERM)
            wait_phase(ledger, job_id, plan.phase)
            log(f"trial {plan.number}: {job_id} is {target.value}")
            time.sleep(plan.moment_s)  # the trial's seeded moment into the phase
            kill_controller(home, job_id)
            result.state_at_kill = ledger.get_job(job_id).state
            log(f"trial {plan.number}: killed {job_id} in {result.state_at_kill}")

            reviver = ["status", job_id] if plan.revive == "status" else ["reconcile"]
            revived = run_orch(reviver, env, timeout=120)
            said = revived.stdout + revived.stderr
            if revived.returncode != 0 or REVIVED_SAYS[plan.revive] not in said:
                result.problems.append(f"`orch {' '.join(reviver)}` did not revive: {said[-400:]}")
            wait_revived(settings, ledger, job_id)
            result.problems += [
                f"after revive: {p}" for p in lease_problems(settings, ledger, job_id, utcnow())
            ]

            job = wait_job(
                ledger, job_id, lambda j: JobState(j.state).is_final, "the end", timeout=300
            )
            submitted, _ = submit.communicate(timeout=60)
            if submit.returncode != 0:
                result.problems.append(f"submit failed: {submitted[-400:]}")
            for pid in leftover_processes(home):
                result.problems.append(f"orch process {pid} still runs after the job ended")
        job = ledger.get_job(job_id)
        result.final_state, result.recoveries, result.step = job.state, job.recoveries, job.step
        result.problems += end_problems(job, EXPECTED[plan.phase], TARGET_STEP)
        ids = sightings.seen | {lease.instance_id for lease in ledger.leases(job_id)}
        result.problems += host_leaks(settings, ids)
        result.problems += lease_problems(
            settings, ledger, job_id, utcnow(), billed=sightings.billed
        )
        result.problems += ledger_problems(settings)
    except (TrialFailed, subprocess.TimeoutExpired, OSError) as exc:
        result.problems.append(f"trial failed: {exc}")
    finally:
        if submit is not None and submit.poll() is None:
            submit.kill()
            submit.wait()
        _end_everything(home)
        result.seconds = time.monotonic() - started
    return result


def _end_everything(home: Path) -> None:
    """The safety net after a trial: controllers killed, every node of the home terminated."""
    for pid in controller_processes(home):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if not home.exists():
        return
    provider = LocalProvider(load_settings(trial_env(home)))
    left = [record.instance_id for record in provider.store.all()]
    if left:
        provider.terminate(left)


def run_trials(
    plans: list[TrialPlan], base: Path, *, log: Callable[[str], None] = print
) -> list[TrialResult]:
    results = []
    for plan in plans:
        directory = base / f"trial-{plan.number:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        result = run_trial(plan, directory, log=log)
        log(result.row())
        results.append(result)
    return results


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    def run(phases: Sequence[str], count: int, seed: int, base: Path) -> list[TrialResult]:
        return run_trials(plan_trials(count, seed, tuple(phases)), base, log=_log)

    return trials_main(
        argv, prog="python -m tests.support.crash_trials", doc=__doc__, phases=PHASES,
        trials=20, seed=8, run=run, table=table,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
