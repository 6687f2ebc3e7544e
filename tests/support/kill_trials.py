"""What the two crash-trial runners share: the local one (`tests.support.crash_trials`) and the
one on `orch sandbox aws` (`tests.support.sandbox_crash_trials`).

A trial submits a detached step-counter job, waits for a phase of it, SIGKILLs its controller a
seeded moment into the phase, revives it with an orch command and lets the job end. The parts
that do not depend on where the nodes run are here: the seeded plans, the trial's job, the
kill, the waits for the revived controller and for every orch process of the trial's home to
end, how the job must have ended, and the command line of both runners.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.config import Settings
from orchestrator.control.process.controllers import controller_running
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger
from tests.support.helpers import counter_run, counter_workdir
from tests.support.leak_checks import controller_processes
from tests.support.waiting import wait_for_job, wait_until


class TrialFailed(Exception):
    """The trial could not go on (the job never reached its phase, a command failed)."""


@dataclass(frozen=True)
class TrialPlan:
    """One trial: where the controller dies, and which command revives it."""

    number: int
    phase: str
    moment_s: float  # seconds after the phase was first seen
    revive: str = "reconcile"  # or "status"


def plan_trials(
    count: int,
    seed: int,
    phases: Sequence[str],
    windows: Mapping[str, float],
    revivers: Sequence[str] = ("reconcile",),
) -> list[TrialPlan]:
    """`count` trials cycling through `phases`, each with a seeded moment in its phase's window
    (`windows`, seconds) and, where there is a choice, a seeded reviver."""
    rng = random.Random(seed)
    plans = []
    for index in range(count):
        phase = phases[index % len(phases)]
        moment = round(rng.uniform(0.0, windows[phase]), 2)
        revive = rng.choice(revivers) if len(revivers) > 1 else revivers[0]
        plans.append(TrialPlan(index + 1, phase, moment, revive))
    return plans


@dataclass(frozen=True)
class TrialJob:
    """The trial's job: 2 spot nodes of the step counter, and a sparse data blob whose sync
    lasts a moment."""

    steps: int
    step_s: float
    checkpoint_every: int
    data_bytes: int
    nodes: int = 2

    def write(self, directory: Path, stop_s: float = 0.0) -> Path:
        """The spec in `directory`, its workdir and data beside it; the job's emergency
        checkpoint takes `stop_s`."""
        data = directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        with open(data / "blob.bin", "wb") as blob:
            blob.truncate(self.data_bytes)
        run = counter_run(
            self.steps, step_s=self.step_s, checkpoint_every=self.checkpoint_every, stop_s=stop_s
        )
        spec = directory / "job.yaml"
        spec.write_text(
            "name: crash\n"
            f"workdir: {counter_workdir(directory)}\n"
            f"data: [{{src: {data}, dst: ~/data}}]\n"
            f"run: {run}\n"
            f"resources: {{nodes: {self.nodes}, gpus_per_node: 1, spot: true}}\n"
            "checkpoint: {dir: ~/ckpt, pull_every: 1}\n"
        )
        return spec


def wait_job(
    ledger: Ledger, job_id: str, predicate: Callable[[Job], bool], what: str, timeout: float
) -> Job:
    """Poll the ledger (every 20 ms) until `predicate` holds; TrialFailed on a final state."""
    final = [state.value for state in JobState if state.is_final]
    return wait_for_job(
        ledger, job_id, predicate, what, timeout, interval=0.02, stop_at=final, fail=TrialFailed
    )


def controller_pid(home: Path, job_id: str) -> int:
    """The pid in the job's controller.pid, checked to be that job's controller."""
    pid = int((home / "jobs" / job_id / "controller.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    if b"orchestrator.control.daemon" not in cmdline or job_id.encode() not in cmdline:
        raise TrialFailed(f"pid {pid} is not the controller of {job_id}: {cmdline!r}")
    return pid


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def kill_controller(home: Path, job_id: str) -> int:
    """SIGKILL the job's controller and wait until it is gone; returns its pid."""
    pid = controller_pid(home, job_id)
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: _gone(pid), f"controller {pid} to die of SIGKILL", 10, interval=0.01,
        fail=TrialFailed,
    )  # fmt: skip
    return pid


def wait_revived(settings: Settings, ledger: Ledger, job_id: str, timeout: float = 20) -> None:
    """Give the reviving command's new controller up to `timeout` s to hold the job's lock (a
    job that ended meanwhile needs none); the checks that follow say what is wrong if not."""

    def back() -> bool:
        ended = JobState(ledger.get_job(job_id).state).is_final
        return ended or controller_running(settings, job_id)

    with contextlib.suppress(TrialFailed):
        wait_until(back, "the revived controller", timeout, interval=0.05, fail=TrialFailed)


def leftover_processes(home: Path, timeout: float = 30) -> list[int]:
    """The orch processes of `home` still running `timeout` s after the job ended (none
    should)."""
    try:
        wait_until(
            lambda: not controller_processes(home), "the orch processes to end", timeout,
            fail=TrialFailed,
        )  # fmt: skip
    except TrialFailed:
        return controller_processes(home)
    return []


def end_problems(job: Job, expected: JobState, steps: int) -> list[str]:
    """How the job's end differs from `expected` (at its last step, where that is success)."""
    if job.state != expected:
        return [f"ended {job.state} ({job.reason}), expected {expected}"]
    if expected == JobState.SUCCEEDED and job.step != steps:
        return [f"ended at step {job.step}, expected {steps}"]
    return []


class Result(Protocol):
    """What both runners' results have."""

    plan: TrialPlan
    problems: list[str]

    @property
    def hit_phase(self) -> bool: ...

    @property
    def ok(self) -> bool: ...


def trials_main(
    argv: list[str] | None,
    *,
    prog: str,
    doc: str | None,
    phases: Sequence[str],
    trials: int,
    seed: int,
    run: Callable[[Sequence[str], int, int, Path], Sequence[Result]],
    table: Callable[[Sequence[Result]], str],
) -> int:
    """The command line of a trial runner: `--trials N --seed S --phase P... --keep DIR`.

    `run(phases, count, seed, base)` runs the trials in `base` (a temporary directory, removed
    after, unless `--keep`). Prints the table; 1 when a trial found a problem or missed its
    phase, 2 when not root (namespace nodes and the sandbox's hosts need it)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=trials)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--phase", choices=phases, action="append", help="only these phases")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("crash trials need root (namespace nodes, the sandbox's hosts)", file=sys.stderr)
        return 2
    base = args.keep or Path(tempfile.mkdtemp(prefix="orch-crash-"))
    try:
        results = run(tuple(args.phase or phases), args.trials, args.seed, base)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(results))
    failed = [r for r in results if not r.ok]
    found = sum(len(r.problems) for r in results)
    print(f"\n{len(results)} trial(s), {len(failed)} failed, {found} problem(s) found")
    return 1 if failed else 0


def assert_trials(results: Sequence[Result], phases: Sequence[str], report: str) -> None:
    """No trial left anything behind, and a kill landed in every phase of `phases`. A trial
    that missed its phase (the kill came as the job had just left it: a phase of a fraction of
    a second on a quick machine) still counts for its leaks; the phase counts as covered when
    another trial aimed at it hit it. With one trial per phase, each must hit."""
    assert not any(result.problems for result in results), f"\n{report}"
    hit = {result.plan.phase for result in results if result.hit_phase}
    missed = [phase for phase in phases if phase not in hit]
    assert not missed, f"no kill landed in {', '.join(missed)}:\n{report}"
