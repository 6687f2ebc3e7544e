"""Crash safety of `--provider aws` on `orch sandbox aws`: seeded `kill -9` trials of a detached
job's controller, each followed by `orch reconcile` (tests/support/sandbox_crash_trials.py says what
a trial does and checks). The regular suite runs one trial; `make soak` runs ten, one pair
per phase, and prints the trial table of each run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kill_trials import assert_trials
from tests.support.sandbox_crash_trials import PHASES, plan_trials, run_trials, table

pytestmark = pytest.mark.e2e

# The phase whose restart is the most involved: a recovery half done (`make soak` runs every
# phase, and tests/e2e/test_crash_trials.py a stop half done on the local provider).
SHORT_PHASES = ("recovering",)


def run_and_show(plans: list, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = run_trials(plans, base, log=lambda text: None)
    shown = table(results)
    with capsys.disabled():
        print(f"\n{shown}")
    assert_trials(results, sorted({result.plan.phase for result in results}), shown)


# `make test` keeps test_crash_trials.py: the same trials on local nodes
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_a_kill_while_recovering_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_and_show(plan_trials(1, seed=5, phases=SHORT_PHASES), tmp_path, capsys)


@pytest.mark.soak
@pytest.mark.timeout(3000)
def test_ten_controller_kills_leave_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_and_show(plan_trials(10, seed=11, phases=PHASES), tmp_path, capsys)
