"""Crash safety on the local provider: the controller is killed with SIGKILL in every phase of a
job, and the next orch command leaves nothing behind (`tests.support.crash_trials` checks it).

`make test` runs a kill while recovering and one while tearing down; `make soak` runs one
kill per phase, and twenty (`python -m tests.support.crash_trials`
runs any number outside pytest).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.crash_trials import PHASES, plan_trials, run_trials, table
from tests.support.kill_trials import assert_trials

pytestmark = pytest.mark.e2e


# The phases whose restarts are the most involved: a recovery half done, a stop half done.
SHORT_PHASES = ("recovery", "teardown")


def run_and_report(phases: tuple[str, ...], count: int, seed: int, base: Path) -> None:
    plans = plan_trials(count, seed, phases)
    results = run_trials(plans, base, log=lambda text: None)
    report = table(results)
    print(f"\n{report}")
    assert [r.plan.phase for r in results] == [phases[i % len(phases)] for i in range(count)]
    assert_trials(results, phases, report)


def test_kills_while_recovering_and_tearing_down_leave_nothing_behind(tmp_path: Path) -> None:
    run_and_report(SHORT_PHASES, 2, seed=8, base=tmp_path)


@pytest.mark.soak
def test_a_kill_in_each_phase_leaves_nothing_behind(tmp_path: Path) -> None:
    run_and_report(PHASES, len(PHASES), seed=8, base=tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_twenty_kills_at_random_moments_leave_nothing_behind(tmp_path: Path) -> None:
    run_and_report(PHASES, 20, seed=20, base=tmp_path)
