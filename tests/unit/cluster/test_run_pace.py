"""A just-started run's first lines are read soon: the run's check pulls rank 0's log alone
between its full checks (`RunWatch.peek`) until rank 0's first progress line, a missed check or
the early window's end; the full checks, which judge every node, keep their interval."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.run_watch import RunWatch, peek_command
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.watching import RunPace, Supervisor
from orchestrator.errors import NodeUnreachable
from orchestrator.node import launch
from orchestrator.node.progress import Metrics


@dataclass
class FakeNode:
    """A node whose log grows as the test says; answers probes (`launch.probe_command`) and
    peeks (`peek_command`: the log's new bytes alone)."""

    log: str = ""
    commands: list[str] = field(default_factory=list)
    down: bool = False  # its command times out
    alive: bool = True  # its connection is up

    def is_alive(self) -> bool:
        return self.alive

    def run(self, command: str, *, timeout: float, check: bool, max_output: int) -> Any:
        self.commands.append(command)
        if self.down:
            raise NodeUnreachable("node: command did not finish within 5 s")
        offset = int(command.split("tail -c +", 1)[1].split()[0]) - 1
        new = self.log.encode()[offset:]
        if launch.PROBE_MARK in command:
            new = f"{launch.PROBE_MARK} running {len(self.log)}\n".encode() + new
        return SimpleNamespace(stdout=new.decode(), stdout_bytes=new, cut=False)


def watch_of(
    nodes: list[FakeNode], tmp_path: Path, **options: Any
) -> tuple[RunWatch, list[Metrics], list[str]]:
    """A run watch of `nodes`, with the watch's `options`: what it reports, and its lines."""
    cluster = SimpleNamespace(
        instances=[SimpleNamespace(instance_id=f"i-{rank}") for rank in range(len(nodes))],
        connections=nodes,
    )
    metrics: list[Metrics] = []
    lines: list[str] = []
    watch = RunWatch(
        cast(Cluster, cluster), launch.NodeLayout("job-1"), tmp_path / "logs",
        on_metrics=lambda m, _at: metrics.append(m), on_line=lines.append, probe_timeout=5,
        **options,
    )  # fmt: skip
    return watch, metrics, lines


def test_a_peek_reads_rank_0_alone_and_a_tick_goes_on_from_where_it_stopped(
    tmp_path: Path,
) -> None:
    head, other = FakeNode(), FakeNode()
    watch, metrics, lines = watch_of([head, other], tmp_path)
    head.log = "[default0]:loading data\n"
    watch.peek()
    assert lines == ["loading data"] and not watch.progress_seen
    assert (len(head.commands), len(other.commands)) == (1, 0)  # the other node is not asked

    head.log += '[default0]:{"step": 1, "loss": 0.5}\n'
    other.log = "[default0]:rank 1 speaks\n"
    watch.peek()
    assert [m.step for m in metrics] == [1] and watch.progress_seen
    assert watch.misses == [0, 0]  # a peek judges nothing

    head.log += '[default0]:{"step": 2, "loss": 0.4}\n'
    assert not watch.tick().done
    assert [m.step for m in metrics] == [1, 2]  # no line read twice, none skipped
    assert (tmp_path / "logs" / "node-0.log").read_text() == head.log
    assert (tmp_path / "logs" / "node-1.log").read_text() == other.log


def test_a_peek_waits_for_a_probe_of_rank_0_still_out_and_skips_a_node_that_is_down(
    tmp_path: Path,
) -> None:
    head = FakeNode(log="[default0]:hello\n")
    watch, _, lines = watch_of([head, FakeNode()], tmp_path)
    out: Future[launch.NodeProbe] = Future()
    watch._pending[0] = out  # a tick's probe of rank 0 that has not answered yet
    watch.peek()
    assert not head.commands and lines == []  # never two reads of rank 0's log at once
    watch._pending[0] = None
    head.down = True
    watch.peek()
    assert lines == [] and watch.offsets[0] == 0 and watch.misses == [0, 0]
    head.down, head.alive = False, False
    asked = len(head.commands)
    watch.peek()
    assert len(head.commands) == asked and lines == []  # no reconnect: that is the ticks'
    head.alive = True
    watch.peek()
    assert lines == ["hello"] and watch.offsets[0] == len(head.log)


def test_the_peek_command_prints_the_log_from_its_offset(tmp_path: Path) -> None:
    layout = launch.NodeLayout("job-1")

    def peek(offset: int) -> str:
        return subprocess.run(
            ["bash", "-c", peek_command(layout, offset)], capture_output=True, text=True,
            env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]}, timeout=10, check=True,
        ).stdout  # fmt: skip

    assert peek(0) == ""  # no log yet
    log = tmp_path / layout.log
    log.parent.mkdir(parents=True)
    log.write_text("one\ntwo\n")
    assert (peek(0), peek(4), peek(8)) == ("one\ntwo\n", "two\n", "")


def test_early_on_a_full_check_comes_every_interval_and_peeks_fill_the_turns_between() -> None:
    pace = RunPace(1.0, started=100.0, peek_s=0.25, window_s=60.0)
    assert pace.early and pace.every_s == 0.25
    turns = [100.0 + 0.25 * n for n in range(9)]
    assert [pace.full_check_due(t) for t in turns] == [
        True, False, False, False, True, False, False, False, True,
    ]  # fmt: skip
    assert pace.full_check_due(102.25 + 0.01) is False
    assert pace.full_check_due(102.999) is True  # a turn that fires a hair early still counts


def watched(*, progress: bool = False, misses: tuple[int, ...] = (0, 0)) -> RunWatch:
    return cast(RunWatch, SimpleNamespace(progress_seen=progress, misses=list(misses)))


def test_the_early_pace_ends_once_at_the_first_progress_a_missed_check_or_the_window() -> None:
    for watch, now in (
        (watched(progress=True), 101.0),
        (watched(misses=(0, 1)), 101.0),
        (watched(), 160.0),
    ):
        pace = RunPace(1.0, started=100.0, peek_s=0.25, window_s=60.0)
        assert pace.settle(watch, now) is True
        assert not pace.early and pace.every_s == 1.0
        assert pace.settle(watch, now) is False  # said once
        assert all(pace.full_check_due(now + n) for n in range(3))
    pace = RunPace(1.0, started=100.0, peek_s=0.25, window_s=60.0)
    assert pace.settle(watched(), 159.0) is False and pace.early


def test_no_early_pace_when_the_interval_is_already_that_short() -> None:
    pace = RunPace(0.2, started=0.0, peek_s=0.25)
    assert not pace.early and pace.every_s == 0.2
    assert pace.full_check_due(0.0) and pace.full_check_due(0.2)
    assert pace.settle(watched(), 1.0) is False


def test_the_paced_check_peeks_between_full_checks(monkeypatch: Any, tmp_path: Path) -> None:
    head, other = FakeNode(log='[default0]:{"step": 7}\n'), FakeNode()
    watch, metrics, _ = watch_of([head, other], tmp_path)
    sampled: list[bool] = []
    journal = SimpleNamespace(sample_progress=lambda: sampled.append(True))
    unused = cast(Any, None)  # what a paced check does not reach
    supervisor = Supervisor(
        journal=cast(Any, journal), spec=unused, layout=unused, logs_dir=tmp_path,
        settings=unused, options=unused, provider=unused, reporter=unused, keeper=unused,
        guards=unused, driver=None, team=None, on_metrics=lambda m, at: None,
    )  # fmt: skip
    full: list[bool] = []
    monkeypatch.setattr(supervisor, "check_run", lambda attempt: full.append(True))
    attempt = Attempt()
    attempt.watch = watch
    pace = RunPace(3600.0, started=0.0, peek_s=0.25)

    assert supervisor.paced_check_run(attempt, pace) is None  # the first check is a full one
    assert full == [True] and not head.commands
    assert supervisor.paced_check_run(attempt, pace) is None  # then a peek
    assert full == [True] and [m.step for m in metrics] == [7] and sampled == [True]
    assert not other.commands
