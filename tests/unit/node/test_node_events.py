"""The node daemon's scheduler on a fake clock: due order, supervision, bounded backoff."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from orchestrator.node import events
from orchestrator.node.events import Event, Scheduler


class Clock:
    """A clock that moves only when the scheduler sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Ticks(Event):
    """Records when it ran; raises while `failing` says so."""

    def __init__(self, name: str, period_s: float, first_s: float | None = None,
                 failing: int = 0, wait: float | None = None) -> None:  # fmt: skip
        self.name = name
        self.period_s = period_s
        self.first_s = first_s
        self.failing = failing  # runs that raise, from the first (-1: every run)
        self.wait = wait
        self.at: list[float] = []

    def run(self, now: float) -> float | None:
        self.at.append(now)
        if self.failing:
            self.failing -= 1
            raise RuntimeError(f"{self.name} broke")
        return self.wait


def run_until(scheduler: Scheduler, clock: Clock, end: float) -> list[tuple[str, float]]:
    ran: list[tuple[str, float]] = []
    while True:
        wait = min(e.due for e in scheduler.events if not e.finished) - clock()
        if clock() + max(wait, 0) > end:
            return ran
        clock.sleep(max(wait, 0))
        ran += [(e.name, clock()) for e in scheduler.run_due(clock())]


def test_events_run_in_the_order_they_fall_due_ties_in_the_order_given() -> None:
    clock = Clock()
    a, b, c = Ticks("a", 2), Ticks("b", 3, first_s=0), Ticks("c", 2)
    scheduler = Scheduler([a, b, c], clock=clock, sleep=clock.sleep)
    assert run_until(scheduler, clock, 6) == [
        ("b", 0), ("a", 2), ("c", 2), ("b", 3), ("a", 4), ("c", 4), ("a", 6), ("b", 6), ("c", 6),
    ]  # fmt: skip
    assert scheduler.status()["b"] == {
        "period_s": 3, "runs": 3, "failures": 0, "failing": False, "last_error": None,
    }  # fmt: skip


def test_a_raising_event_is_retried_with_a_bounded_backoff_while_the_others_run_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock()
    broken, steady = Ticks("broken", 1, failing=-1), Ticks("steady", 1)
    reported: list[int] = []
    scheduler = Scheduler(
        [broken, steady], clock=clock, sleep=clock.sleep, max_backoff_s=60,
        on_failure=lambda event: reported.append(event.failures),
    )  # fmt: skip
    run_until(scheduler, clock, 200)
    gaps = [later - earlier for earlier, later in itertools.pairwise(broken.at)]
    assert gaps == [1, 2, 4, 8, 16, 32, 60, 60]  # doubled, then never past the cap
    assert steady.at == [float(t) for t in range(1, 201)]  # one a second throughout
    assert reported == list(range(1, 10))
    status = scheduler.status()["broken"]
    assert status["failures"] == 9 and status["failing"]
    assert status["last_error"] == "RuntimeError: broken broke"
    out = capsys.readouterr().out
    assert out.count("Traceback") == 1 and "broken failed" in out  # the same words: once


def test_one_good_run_ends_the_backoff_and_a_longer_period_is_its_own_cap() -> None:
    clock = Clock()
    flaky = Ticks("flaky", 1, failing=3)
    slow = Ticks("slow", 100, failing=-1)
    scheduler = Scheduler([flaky, slow], clock=clock, sleep=clock.sleep, max_backoff_s=10)
    run_until(scheduler, clock, 310)
    assert flaky.at[:6] == [1, 2, 4, 8, 9, 10]  # three failures back off, then each second
    assert slow.at == [100, 200, 300]  # a backoff never shortens nor outgrows the period
    assert scheduler.status()["flaky"]["failing"] is False


def test_an_event_that_does_not_back_off_keeps_its_period_while_it_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock()
    safety = Ticks("safety", 2, failing=-1)
    safety.backs_off = False
    scheduler = Scheduler([safety], clock=clock, sleep=clock.sleep, max_backoff_s=60)
    run_until(scheduler, clock, 20)
    assert safety.at == [float(t) for t in range(2, 21, 2)] and safety.failures == 10
    assert capsys.readouterr().out.count("Traceback") == 1  # counted each time, logged once


def test_a_report_that_fails_does_not_stop_the_scheduler() -> None:
    clock = Clock()
    broken, steady = Ticks("broken", 1, failing=-1), Ticks("steady", 1)

    def report(event: Event) -> None:
        raise OSError("disk full")

    scheduler = Scheduler([broken, steady], clock=clock, sleep=clock.sleep, on_failure=report)
    run_until(scheduler, clock, 5)
    assert len(steady.at) == 5 and broken.failures == 3


def test_an_event_sets_its_next_run_and_a_finished_one_is_not_run_again() -> None:
    clock = Clock()
    soon = Ticks("soon", 10, first_s=0, wait=0.5)
    once = Ticks("once", 1, first_s=0)
    scheduler = Scheduler([soon, once], clock=clock, sleep=clock.sleep)
    scheduler.run_due(clock())
    once.finished = True
    run_until(scheduler, clock, 2)
    assert soon.at == [0, 0.5, 1.0, 1.5, 2.0] and once.at == [0]
    soon.finished = True
    scheduler.run_forever()  # returns: nothing is left to run
    assert clock() == 2.0


def test_the_daemons_shipped_modules_are_python_3_8() -> None:
    folder = Path(events.__file__).parent
    for name in ("events.py", "notice_event.py", "guard.py", "guard_files.py"):
        ast.parse((folder / name).read_text(), feature_version=(3, 8))
