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

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Settings, load_settings
from orchestrator.control.supervision import controller_running
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine, utcnow
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import (
    ORCH,
    REPO,
    counter_run,
    counter_workdir,
    fast_env,
    run_orch,
)
from tests.support.leak_checks import (
    NodeSightings,
    controller_processes,
    host_leaks,
    lease_problems,
    ledger_problems,
)
from tests.support.waiting import wait_for_job

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

NODES = 2
TARGET_STEP = 48
STEP_S = 0.15  # 7 s of training: long enough for the running and recovery phases
STOP_S = 2.0  # the emergency checkpoint's time in teardown trials: outlasts the window
DATA_BYTES = 64 * 1024 * 1024  # sparse: makes the sync phase last a moment


@dataclass(frozen=True)
class TrialPlan:
    """One trial: where the controller dies, and which command revives it."""

    number: int
    phase: str  # one of PHASES
    moment_s: float  # seconds after the phase was first seen
    revive: str  # "status" or "reconcile"


def plan_trials(count: int, seed: int, phases: tuple[str, ...] = PHASES) -> list[TrialPlan]:
    """`count` trials cycling through `phases`, with seeded moments and revivers."""
    rng = random.Random(seed)
    plans = []
    for index in range(count):
        phase = phases[index % len(phases)]
        moment = round(rng.uniform(0.0, WINDOW_S[phase]), 2)
        plans.append(TrialPlan(index + 1, phase, moment, rng.choice(REVIVERS)))
    return plans


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


def table(results: list[TrialResult]) -> str:
    return "\n".join([HEADER, *(result.row() for result in results)])


def write_job(directory: Path, stop_s: float = 0.0) -> Path:
    """The trial's job: the step counter (the trainer contract without torch's import time in
    every rank), whose emergency checkpoint takes `stop_s`, and a data blob."""
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "blob.bin", "wb") as blob:
        blob.truncate(DATA_BYTES)
    spec = directory / "job.yaml"
    spec.write_text(
        "name: crash\n"
        f"workdir: {counter_workdir(directory)}\n"
        f"data: [{{src: {data}, dst: ~/data}}]\n"
        f"run: {counter_run(TARGET_STEP, step_s=STEP_S, checkpoint_every=2, stop_s=stop_s)}\n"
        f"resources: {{nodes: {NODES}, gpus_per_node: 1, spot: true}}\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 1}\n"
    )
    return spec


def trial_env(home: Path) -> dict[str, str]:
    return fast_env(home)


class TrialFailed(Exception):
    """The trial could not go on (the job never reached its phase, a command failed)."""


def wait_job(
    ledger: Ledger, job_id: str, predicate: Callable[[Job], bool], what: str, timeout: float
) -> Job:
    """Poll the ledger (every 20 ms) until `predicate` holds; TrialFailed on a final state."""
    final = [state.value for state in JobState if state.is_final]
    return wait_for_job(
        ledger, job_id, predicate, what, timeout, interval=0.02, stop_at=final, fail=TrialFailed
    )


def wait_ledger(path: Path, submit: subprocess.Popen[str], timeout: float = 60) -> Ledger:
    """The ledger once `orch submit` has made it (its schema complete: a job record is written
    after the ledger is opened), so that opening it here never races the submit's schema."""
    deadline = time.monotonic() + timeout
    while not any(path.parent.glob("jobs/*/job.json")):
        if submit.poll() is not None or time.monotonic() > deadline:
            raise TrialFailed(f"submit made no job: {submit.communicate()[0][-400:]}")
        time.sleep(0.01)
    return Ledger(make_engine(path))


def wait_job_id(ledger: Ledger, submit: subprocess.Popen[str], timeout: float = 60) -> str:
    """The id of the trial's job as soon as the submit registered it."""
    deadline = time.monotonic() + timeout
    while not (jobs := ledger.jobs()):
        if submit.poll() is not None or time.monotonic() > deadline:
            raise TrialFailed(f"submit registered no job: {submit.communicate()[0][-400:]}")
        time.sleep(0.01)
    return jobs[0].id


def wait_phase(ledger: Ledger, job_id: str, phase: str, timeout: float = 240) -> None:
    """Wait until the job is in one of `phase`'s states (a recovery: once it began, which the
    job's recovery count tells); TrialFailed if it went through them unseen."""
    first, states = PHASE_STATE[phase], PHASE_STATES[phase]
    deadline = time.monotonic() + timeout

    def inside(job: Job) -> bool:
        return job.state in states and (phase != "recovery" or job.recoveries >= 1)

    while not inside(job := ledger.get_job(job_id)):
        if any(event.kind == first.value for event in ledger.events(job_id)):
            # The state is written just before its event: both may have landed between the
            # two reads above, so the job is asked once more before the phase counts as missed.
            if inside(ledger.get_job(job_id)):
                return
            raise TrialFailed(f"missed {phase}: the job went through it unseen")
        if JobState(job.state).is_final or time.monotonic() > deadline:
            raise TrialFailed(f"the job never became {first.value}")
        time.sleep(0.02)


def _training(job: Job) -> bool:
    """Rank 0 reported progress (the first report reaches the ledger at once)."""
    return job.state == JobState.RUNNING and (job.step or 0) >= 1


def orch_background(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ORCH, *args], env=env, cwd=REPO, text=True, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def controller_pid(home: Path, job_id: str) -> int:
    """The pid in the job's controller.pid, checked to be that job's controller."""
    pid = int((home / "jobs" / job_id / "controller.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    if b"orchestrator.control.daemon" not in cmdline or job_id.encode() not in cmdline:
        raise TrialFailed(f"pid {pid} is not the controller of {job_id}: {cmdline!r}")
    return pid


def reclaim_node_1(settings: Settings, ledger: Ledger, job_id: str) -> None:
    """Take node 1 of the job the way `orch local preempt JOB --node 1` does (no notice)."""
    (lease,) = [lease for lease in ledger.leases(job_id, open_only=True) if lease.rank == 1]
    if LocalProvider(settings).reclaim(lease.instance_id) is None:
        raise TrialFailed(f"node 1 ({lease.instance_id}) was gone before the reclaim")


def kill_controller(home: Path, job_id: str) -> int:
    """SIGKILL the job's controller and wait until it is gone; returns its pid."""
    pid = controller_pid(home, job_id)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return pid
        if state == "Z":
            return pid
        time.sleep(0.01)
    raise TrialFailed(f"controller {pid} outlived SIGKILL")


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
    spec = write_job(directory, STOP_S if plan.phase == "teardown" else 0.0)
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
            time.sleep(plan.moment_s)
            kill_controller(home, job_id)
            result.state_at_kill = ledger.get_job(job_id).state
            log(f"trial {plan.number}: killed {job_id} in {result.state_at_kill}")

            reviver = ["status", job_id] if plan.revive == "status" else ["reconcile"]
            revived = run_orch(reviver, env, timeout=120)
            said = revived.stdout + revived.stderr
            if revived.returncode != 0 or REVIVED_SAYS[plan.revive] not in said:
                result.problems.append(f"`orch {' '.join(reviver)}` did not revive: {said[-400:]}")
            deadline = time.monotonic() + 20
            while not controller_running(settings, job_id) and time.monotonic() < deadline:
                if JobState(ledger.get_job(job_id).state).is_final:
                    break
                time.sleep(0.05)
            result.problems += [
                f"after revive: {p}" for p in lease_problems(settings, ledger, job_id, utcnow())
            ]

            job = wait_job(
                ledger, job_id, lambda j: JobState(j.state).is_final, "the end", timeout=300
            )
            submitted, _ = submit.communicate(timeout=60)
            if submit.returncode != 0:
                result.problems.append(f"submit failed: {submitted[-400:]}")
            deadline = time.monotonic() + 30
            while controller_processes(home) and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in controller_processes(home):
                result.problems.append(f"orch process {pid} still runs after the job ended")
        job = ledger.get_job(job_id)
        result.final_state, result.recoveries, result.step = job.state, job.recoveries, job.step
        expected = EXPECTED[plan.phase]
        if job.state != expected:
            result.problems.append(f"ended {job.state} ({job.reason}), expected {expected}")
        elif expected == JobState.SUCCEEDED and job.step != TARGET_STEP:
            result.problems.append(f"ended at step {job.step}, expected {TARGET_STEP}")
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
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.crash_trials", description=__doc__
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--phase", choices=PHASES, action="append", help="only these phases")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("crash trials need root (namespace nodes)", file=sys.stderr)
        return 2
    plans = plan_trials(args.trials, args.seed, tuple(args.phase or PHASES))
    base = args.keep or Path(tempfile.mkdtemp(prefix="orch-crash-"))
    try:
        results = run_trials(plans, base, log=_log)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(results))
    failed = [r for r in results if not r.ok]
    leaks = sum(len(r.problems) for r in results)
    print(f"\n{len(results)} trial(s), {len(failed)} failed, {leaks} problem(s) found")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())


def assert_trials(results: Sequence[Any], phases: Sequence[str], report: str) -> None:
    """No trial left anything behind, and a kill landed in every phase of `phases`. A trial
    that missed its phase (the kill came as the job had just left it: a phase of a fraction of
    a second on a quick machine) still counts for its leaks; the phase counts as covered when
    another trial aimed at it hit it. With one trial per phase, each must hit."""
    assert not any(result.problems for result in results), f"\n{report}"
    hit = {result.plan.phase for result in results if result.hit_phase}
    missed = [phase for phase in phases if phase not in hit]
    assert not missed, f"no kill landed in {', '.join(missed)}:\n{report}"
