"""A node the provider took is found within seconds of the first check that asks it: a late
probe puts its node to the provider at once, and again every second while the check waits,
rather than waiting out the whole probe timeout (which, with checks that wait a whole watch
interval, let a loss go unseen for two intervals or more)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.run_watch import RunWatch
from orchestrator.node import launch
from tests.unit.cluster.test_run_pace import FakeNode


class CutOff(FakeNode):
    """A node whose link went down: a probe hangs until the test ends."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def run(self, command: str, *, timeout: float, check: bool, max_output: int) -> Any:
        self.released.wait(30)
        return super().run(command, timeout=timeout, check=check, max_output=max_output)


def watch_of(nodes: list[FakeNode], tmp_path: Path, confirm) -> RunWatch:  # noqa: ANN001
    cluster = SimpleNamespace(
        instances=[SimpleNamespace(instance_id=f"i-{rank}") for rank in range(len(nodes))],
        connections=nodes,
    )
    return RunWatch(
        cast(Cluster, cluster), launch.NodeLayout("job-1"), tmp_path / "logs",
        on_metrics=lambda m, _at: None, on_line=lambda _line: None, probe_timeout=5,
        confirm_gone=confirm, suspect_after=0.5,
    )  # fmt: skip


def test_a_node_the_provider_took_misses_the_check_as_soon_as_the_provider_says_so(
    tmp_path: Path,
) -> None:
    alive, lost = FakeNode(), CutOff()
    asked: list[list[int]] = []
    reclaimed_at = time.monotonic() + 1.2  # the provider records the reclaim a moment later

    def confirm(ranks: list[int]) -> bool:
        asked.append(ranks)
        return time.monotonic() >= reclaimed_at

    watch = watch_of([alive, lost], tmp_path, confirm)
    try:
        started = time.monotonic()
        watch.tick()
        took = time.monotonic() - started
        assert watch.misses == [0, 1]
        assert 1.2 <= took < 3.0, took  # not the 5 s probe timeout
        assert asked and all(ranks == [1] for ranks in asked)  # the late node alone

        # Its probe is still out at the next check: it is late from the start, and asked at once.
        started = time.monotonic()
        watch.tick()
        assert time.monotonic() - started < 0.5 and watch.misses == [0, 2]
    finally:
        lost.released.set()


def test_a_slow_node_the_provider_did_not_take_gets_the_whole_probe_timeout(
    tmp_path: Path,
) -> None:
    slow = CutOff()
    threading.Timer(2.5, slow.released.set).start()  # answers after 2.5 s: late, not lost
    watch = watch_of([slow], tmp_path, lambda ranks: False)
    try:
        watch.tick()
        assert watch.misses == [0]
    finally:
        slow.released.set()
