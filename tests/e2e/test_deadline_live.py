"""The deadline-aware spot policy applied live: a job under Uniform Progress on real local
nodes, while a compressed availability trace grants spot, takes it away, and grants it again.

The local provider follows the trace (`orch local spot --trace`: spot launches refused while
it says 0) and `orch local chaos --follow-trace` takes the job's spot node back when it turns
0. The controller must go on-demand while the trace keeps spot away, come back to spot once
the trace gives it back, finish before the deadline, and cost what the simulator predicts for
the same trace with the job's measured restart overhead and compute time.

The simulator gets the job's compute time from the step times the job printed, and the
mean of its measured restarts (each from what began it to its first progress line).

The work and the deadline are multiples of how long one start of a job takes on this machine
now (launch, sync, torchrun, first progress), measured first with a short job: a loaded
machine gets a longer scenario, not a different one. The trace is written as the run goes:
spot is taken away once the job has made progress on it, and given back once the job made
progress on on-demand (Uniform Progress takes spot back as soon as it is there, so an earlier
return would leave the on-demand run no step); the ticks in force are never rewritten, so the
simulator replays exactly what the job lived through.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.ledger.store import Job, Ledger, make_engine
from orchestrator.node.progress import local_rank_line
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.local.spot import follow_trace
from orchestrator.providers.traces import SpotTrace
from orchestrator.spot.inputs import restart_durations
from orchestrator.spot.policies import get_policy
from orchestrator.spot.simulate import Prices, Scenario, simulate
from tests.support.deadline_job import STEP_S, write_job
from tests.support.helpers import (
    Background,
    assert_nothing_left,
    orch_env,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

GAP_S, SCALE = 60, 60  # trace ticks of a minute, replayed 60 x faster: one tick per second
TICK_S = GAP_S / SCALE
ON_DEMAND, SPOT = Decimal("3.06"), Decimal("1.02")
NOTICE_S = 2  # a reclaim's notice: the job's checkpoint is pulled before the node goes
TIGHT_UNITS = 20  # starts' worth of time left when Uniform Progress finds the deadline tight


def compute_seconds(node_log: str) -> float:
    """Seconds of compute the job's steps took, from the times the script printed with them:
    each step once (one redone after a reclaim counts as its last run), the first step of a
    run (after its start-up) at the median step time. A run that resumes right after the step
    its predecessor stopped at has its first step follow that one: the time between them is a
    restart, not compute, so steps follow each other only within one run (one process)."""
    steps: dict[int, float | None] = {}
    last_step, last_at, last_run = 0, 0.0, None
    for line in node_log.splitlines():
        _, text = local_rank_line(line)
        if not text.startswith('{"step"'):
            continue
        record = json.loads(text)
        step, at, run = record["step"], record["t"], record["run"]
        follows = (last_step, last_run) == (step - 1, run) and at > last_at
        steps[step] = at - last_at if follows else None
        last_step, last_at, last_run = step, at, run
    known = sorted(t for t in steps.values() if t is not None)
    median = known[len(known) // 2]
    return sum(median if t is None else t for t in steps.values())


def events_of(job: dict) -> list[tuple[str, datetime]]:
    return [(e["kind"], datetime.fromisoformat(e["at"])) for e in job["events"]]


def measure_start(tmp_path: Path, env: dict[str, str]) -> float:
    """Seconds from PROVISIONING to the first progress line of a short job, here and now."""
    result = run_orch(["submit", str(write_job(tmp_path, "warmup", 16)), "--json"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    (start,) = restart_durations(events_of(json.loads(result.stdout)))
    return start


@dataclass(frozen=True)
class Plan:
    """The work and the deadline, from the time one start takes here now (`start_s`).

    Uniform Progress is loose at first: spot while it lasts, then it waits for spot until the
    deadline is tight (work left = 0.7 x time left, `TIGHT_UNITS` units before the deadline);
    from there its line of progress is behind without spot, so it goes on-demand, gaining
    0.3 s on the line per second. It takes spot again as soon as spot is back (its rule 3),
    which the test holds back until the on-demand run made one unit of progress
    (`on_demand_steps`); the safety net (time left < work left + 2 restarts) stays out of the
    way as long as a restart takes less than about 1.9 units.
    """

    start_s: float

    @property
    def unit_s(self) -> float:  # a start, with room to be slower than measured
        return 1.3 * max(self.start_s, 4.0)

    @property
    def spot_steps(self) -> int:  # progress on spot before the trace takes it away
        return round(1.5 * self.unit_s / STEP_S)

    @property
    def on_demand_steps(self) -> int:  # progress on on-demand before the trace gives spot back
        return round(self.unit_s / STEP_S)

    @property
    def deadline_s(self) -> int:
        reclaimed_at = self.start_s + self.spot_steps * STEP_S + 3  # progress is seen late
        wait_s = max(5.0, 0.5 * self.unit_s)  # loose, without spot: waiting for it
        return math.ceil(reclaimed_at + NOTICE_S + wait_s + TIGHT_UNITS * self.unit_s)

    @property
    def total_steps(self) -> int:
        return self.spot_steps + round(0.7 * TIGHT_UNITS * self.unit_s / STEP_S)


class LiveTrace:
    """The trace the local provider follows, written as the run goes: a tick once in force is
    never changed, only the ticks to come."""

    def __init__(self, provider: LocalProvider) -> None:
        clock = provider.spot_capacity().clock
        assert clock is not None
        self.provider, self.clock = provider, clock
        self.counts = list(clock.trace.counts)

    def from_next_tick(self, count: int) -> int:
        """Grant `count` spot instances from the next tick on; returns that tick."""
        tick = self.clock.tick_at(datetime.now(UTC)) + 1
        self.counts[tick:] = [count] * (len(self.counts) - tick)
        self.clock = follow_trace(
            self.provider.store, SpotTrace("live.json", GAP_S, tuple(self.counts)),
            time_scale=SCALE, now=self.clock.started_at,
        )  # fmt: skip
        return tick


def still_running(ledger: Ledger, job_id: str) -> Job:
    """The job's row; fails with its events and policy state if it has already ended."""
    job = ledger.get_job(job_id)
    if job.state in ("SUCCEEDED", "FAILED"):
        timeline = "\n".join(
            f"{event.at.isoformat()[11:23]} {event.kind} {event.message}"
            for event in ledger.events(job_id)
            if event.kind != "CHECKPOINT"
        )
        pytest.fail(f"the job ended early: {job}\n{job.policy_state}\n{timeline}")
    return job


def made_spot_progress(ledger: Ledger, job_id: str, steps: int) -> bool:
    job = still_running(ledger, job_id)
    markets = {lease.market for lease in ledger.leases(job_id, open_only=True)}
    return markets == {"spot"} and (job.step or 0) >= steps


def made_on_demand_progress(ledger: Ledger, job_id: str, steps: int) -> bool:
    """Has the job, on on-demand now, made `steps` steps since that run's first progress?"""
    job = still_running(ledger, job_id)
    markets = {lease.market for lease in ledger.leases(job_id, open_only=True)}
    if markets != {"on-demand"}:
        return False
    events = ledger.events(job_id)
    launched = [e.at for e in events if e.kind == "LAUNCHED" and "on-demand" in e.message]
    first = [e for e in events if e.kind == "TRAINING" and launched and e.at > launched[-1]]
    return bool(first) and (job.step or 0) >= (first[-1].step or 0) + steps


# two minutes of a live market; `make test` keeps the live driver surviving its controller
# below, and the policy's decisions in test_deadline_driver, test_spot_policy and test_simulate
@pytest.mark.soak
def test_uniform_progress_goes_on_demand_without_spot_back_to_spot_and_meets_the_deadline(
    tmp_path: Path,
) -> None:
    home = tmp_path / "orch"
    env = orch_env(
        home,
        ORCH_WATCH_INTERVAL="1",
        ORCH_NOTICE_POLL_INTERVAL="1",
        ORCH_POLICY_INTERVAL=str(TICK_S),
        ORCH_LOCAL_PRICE_PER_HOUR=str(ON_DEMAND),
        ORCH_LOCAL_SPOT_PRICE_PER_HOUR=str(SPOT),
    )
    plan = Plan(measure_start(tmp_path, env))
    env["ORCH_RESTART_OVERHEAD_PRIOR"] = f"{plan.unit_s:.1f}"
    # Spot for as long as the job may run, until the run below changes what is to come.
    trace_file = tmp_path / "trace.json"
    ticks = math.ceil(plan.deadline_s / TICK_S) + 600
    trace_file.write_text(json.dumps({"metadata": {"gap_seconds": GAP_S}, "data": [1] * ticks}))
    traced = run_orch(["local", "spot", "--trace", str(trace_file), "--time-scale", "60"], env)
    assert traced.returncode == 0, traced.stdout + traced.stderr
    trace = LiveTrace(LocalProvider(load_settings(env)))
    spec = write_job(
        tmp_path, "deadline", plan.total_steps,
        f"deadline: {plan.deadline_s}s\nspot_policy: uniform-progress\n",
    )  # fmt: skip
    submitted = run_orch(["submit", str(spec), "--detach"], env, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    chaos = Background(["local", "chaos", job_id, "--follow-trace", "--notice", str(NOTICE_S)], env)
    ledger = Ledger(make_engine(home / "orch.db"))
    try:
        wait_until(
            lambda: made_spot_progress(ledger, job_id, plan.spot_steps), "progress on spot",
            timeout=plan.deadline_s,
        )  # fmt: skip
        spot_gone = trace.from_next_tick(0)
        wait_until(
            lambda: made_on_demand_progress(ledger, job_id, plan.on_demand_steps),
            "progress on on-demand", timeout=plan.deadline_s,
        )  # fmt: skip
        spot_back = trace.from_next_tick(1)
        job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=plan.deadline_s)
        assert chaos.finish(timeout=30) == 0, chaos.output
    finally:
        if chaos.proc.poll() is None:
            chaos.proc.kill()
    describe = f"{plan}, trace {spot_gone}-{spot_back}:\n" + "\n".join(
        f"{e['at'][11:23]} {e['kind']} {e['message']}"
        for e in job["events"]
        if e["kind"] != "CHECKPOINT"
    )

    # It met the deadline.
    assert job["state"] == "SUCCEEDED", describe
    created = datetime.fromisoformat(job["created_at"])
    ended = datetime.fromisoformat(job["ended_at"])
    assert ended <= created + timedelta(seconds=plan.deadline_s), describe
    assert job["step"] == plan.total_steps

    # Spot, then on-demand while the trace kept spot away, then spot again once it paid.
    markets = [lease["market"] for lease in job["leases"]]
    assert markets == ["spot", "on-demand", "spot"], describe
    launched = [
        trace.clock.tick_at(datetime.fromisoformat(lease["launched_at"])) for lease in job["leases"]
    ]
    assert spot_gone <= launched[1] < spot_back <= launched[2], (launched, describe)
    assert job["recoveries"] == 1 and job["switches"] == 1, describe
    kinds = [e["kind"] for e in job["events"]]
    assert kinds.count("PREEMPTED") == 1 and kinds.count("SWITCHED") == 1, describe
    policy = [e["message"] for e in job["events"] if e["kind"] == "POLICY"]
    assert any(m.startswith("uniform-progress: on-demand") and "spot unavailable" in m
               for m in policy), describe  # fmt: skip
    switching = next(e for e in job["events"] if e["kind"] == "SWITCHING")
    assert "on-demand -> spot" in switching["message"], describe

    # The bill is what the simulator predicts for the same trace and the measured job.
    starts = restart_durations(events_of(job))
    assert len(starts) == 3, describe
    # The simulated job starts where the controller took its first decision: the time its
    # process took to start after the submit is no restart overhead.
    first = next(datetime.fromisoformat(e["at"]) for e in job["events"] if e["kind"] == "POLICY")
    began = trace.clock.tick_at(first)
    deadline = created + timedelta(seconds=plan.deadline_s)
    scenario = Scenario(
        job_s=compute_seconds((home / "jobs" / job_id / "logs" / "node-0.log").read_text()),
        deadline_s=(deadline - trace.clock.tick_start(began)).total_seconds(),
        overhead_s=sum(starts) / len(starts),
        prices=Prices(on_demand=ON_DEMAND, spot=SPOT),
        start_tick=began,
    )
    predicted = simulate(
        SpotTrace("live", TICK_S, tuple(trace.counts)), get_policy("uniform-progress"), scenario
    )
    spend = Decimal(str(job["spend_usd"]))
    print(
        f"start {plan.start_s:.1f} s, restarts {[round(d, 1) for d in starts]} s, compute "
        f"{scenario.job_s:.1f} s: ledger ${spend:.4f}, simulator ${predicted.cost}"
    )
    assert predicted.met_deadline and (predicted.restarts, predicted.preemptions) == (3, 1), (
        predicted, scenario, describe,
    )  # fmt: skip
    assert abs(spend - predicted.cost) <= Decimal("0.10") * predicted.cost, (
        spend, predicted, scenario, describe,
    )  # fmt: skip
    assert_nothing_left(job)


def test_a_job_waiting_for_spot_survives_its_controller(tmp_path: Path) -> None:
    """spot-only with no spot: the job waits with no node; its controller is killed; the one
    any orch command revives goes on waiting, and launches on spot once there is some."""
    home = tmp_path / "orch"
    env = orch_env(
        home, ORCH_WATCH_INTERVAL="1", ORCH_POLICY_INTERVAL="0.5",
        ORCH_LOCAL_PRICE_PER_HOUR=str(ON_DEMAND),
    )  # fmt: skip
    assert run_orch(["local", "spot", "off"], env).returncode == 0
    spec = write_job(tmp_path, "waiter", 8, "spot_policy: spot-only\n")
    submitted = run_orch(["submit", str(spec), "--detach"], env, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    ledger = Ledger(make_engine(home / "orch.db"))
    wait_until(lambda: ledger.get_job(job_id).state == "WAITING", "WAITING", timeout=120)
    # On purpose: a few of the policy's decisions (every 0.5 s) pass while the job waits, so
    # that the kill lands in that loop rather than in its first turn.
    time.sleep(2)
    pid = int((home / "jobs" / job_id / "controller.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), "the controller gone", timeout=30)
    assert ledger.leases(job_id) == [] and ledger.get_job(job_id).state == "WAITING"
    assert run_orch(["local", "spot", "on"], env).returncode == 0
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=180)  # revives it
    assert job["state"] == "SUCCEEDED", job["events"]
    assert [lease["market"] for lease in job["leases"]] == ["spot"]
    kinds = [e["kind"] for e in job["events"]]
    assert kinds.count("WAITING") == 1 and kinds.index("WAITING") < kinds.index("PROVISIONING")
    policy = [e["message"] for e in job["events"] if e["kind"] == "POLICY"]
    assert policy[0].startswith("spot-only: wait") and policy[-1].startswith("spot-only: spot")
    assert job["recoveries"] == 0 and job["switches"] == 0
    assert_nothing_left(job)
