"""A run's progress (`node.run_progress`): the clock both the controller and the node guard
judge a start and a stall by, and the guard reading it on a node, against real files in a
temporary home and a real listening socket for the run's master."""

from __future__ import annotations

import ast
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.node import launch
from orchestrator.node.progress import parse_metrics
from orchestrator.node.run_progress import (
    FOLLOW_LOOKS,
    ORPHANED,
    READ_CHUNK,
    SETUP_DONE,
    SETUP_RUNNING,
    ProgressClock,
    launch_facts,
    step_of,
)
from tests.unit.node.test_guard_program import Node


def step(n: int) -> str:
    return "[default0]:" + json.dumps({"step": n, "loss": 1.0})


# --- the clock ---------------------------------------------------------------------------------
def test_a_start_without_progress_fails_after_the_start_timeout() -> None:
    clock = ProgressClock(100.0)
    assert clock.due(119.0, 20, None) is None
    assert clock.due(120.0, 20, None) == ("start", 120.0, 20.0)
    assert clock.due(500.0, None, 30) is None  # no start timeout: nothing before progress


def test_the_setup_holds_the_start_clock_which_starts_at_its_end() -> None:
    clock = ProgressClock(0.0)
    clock.feed(SETUP_RUNNING, 1.0)
    assert clock.due(1000.0, 20, None) is None  # a long pip install is no failed start
    clock.feed(SETUP_DONE, 1000.0)
    assert clock.due(1019.0, 20, None) is None
    assert clock.due(1020.0, 20, None)[0] == "start"
    skipped = ProgressClock(0.0)
    skipped.feed("[orch] setup: unchanged since it last ran on this node, skipped", 50.0)
    assert skipped.due(69.0, 20, None) is None


def test_a_job_that_printed_steps_is_judged_by_its_steps_alone() -> None:
    clock = ProgressClock(0.0, steps=True)  # an earlier run printed step lines
    clock.feed("[default0]:loading checkpoint step-000080", 5.0)
    clock.feed("[W socket.cpp] torchrun's own warning", 6.0)
    assert clock.due(20.0, 20, None)[0] == "start"
    clock.feed(step(81), 21.0)
    assert clock.due(40.0, 20, 30) is None
    clock.feed(step(81), 45.0)  # the same step again is no progress
    clock.feed("[default0]:still alive", 46.0)
    assert clock.due(50.0, 20, 30) is None
    assert clock.due(51.0, 20, 30) == ("stall", 51.0, 30.0)
    clock.feed(step(80), 52.0)  # a resume from an earlier step moves on too
    assert clock.due(60.0, 20, 30) is None


def test_a_plain_text_script_progresses_while_rank_0_prints() -> None:
    clock = ProgressClock(0.0)
    clock.feed("[default1]:other ranks do not count", 1.0)
    clock.feed("[W socket.cpp] nor does torchrun", 2.0)
    clock.feed("[orch] nor does the launch script", 3.0)
    assert clock.progress_at is None
    clock.feed("[default0]:epoch 1 loss 0.9", 4.0)
    assert clock.due(10.0, 5, 8) is None
    assert clock.due(12.0, 5, 8) == ("stall", 12.0, 8.0)
    clock.feed("[default0]:" + json.dumps({"step": 3}), 12.5)
    clock.feed("[default0]:epoch 2 loss 0.8", 20.0)  # after a step line, only steps count
    assert clock.due(20.5, 5, 8) == ("stall", 20.5, 8.0)


def test_launcher_none_reads_node_0s_own_lines_as_rank_0s() -> None:
    clock = ProgressClock(0.0)
    clock.feed(json.dumps({"step": 1}), 2.0, unprefixed_is_rank0=True)
    assert clock.step == 1 and clock.progress_at == 2.0


def test_a_run_taken_over_while_it_trains_has_no_start_to_fail() -> None:
    clock = ProgressClock(100.0, steps=True, starting=False)
    assert clock.due(1000.0, 20, None) is None
    assert clock.due(130.0, 20, 30)[0] == "stall"


def test_the_guard_and_the_controller_read_the_same_step_lines() -> None:
    lines = [
        '{"step": 3, "loss": 0.5}',
        '{"event": "done", "step": 9}',
        '{"event": "checkpoint", "step": 4}',
        '{"step": true}',
        '{"step": "5"}',
        "[" * 5000,
        "{" * 5000,
        "not json",
        '["step", 1]',
    ]
    for text in lines:
        metrics = parse_metrics(text)
        assert step_of(text) == (None if metrics is None else metrics.step), text


def test_the_shipped_module_is_python_3_8() -> None:
    source = Path(launch.__file__).with_name("run_progress.py").read_text()
    ast.parse(source, feature_version=(3, 8))


# --- what a node's launch script tells its guard ---------------------------------------------
def script(launcher: str = "torchrun", rank: int = 1) -> str:
    cluster = launch.ClusterLaunch(
        job_id="j-1", run="python train.py", setup=None, num_nodes=2, procs_per_node=2,
        master_addr="10.0.0.3", master_port=29511, node_ips=["10.0.0.3", "10.0.0.4"],
        checkpoint_dir="ckpt", user_env={"ORCH_MASTER_ADDR": "not the master"},
        launcher=launcher,
    )  # fmt: skip
    return launch.launch_script(cluster, launch.NodeLaunch(rank, "lo"))


def test_the_guard_reads_rank_master_and_launcher_from_the_launch_script() -> None:
    assert launch_facts(script()) == (1, ("10.0.0.3", 29511), True)
    assert launch_facts(script("none", rank=0)) == (0, ("10.0.0.3", 29511), False)
    assert launch_facts(None) == (None, None, False)
    forged = "export ORCH_NODE_RANK=x\nexport ORCH_MASTER_ADDR=evil.example\n"
    assert launch_facts(forged + "export ORCH_MASTER_PORT=80\n") == (None, None, False)
    # digits `int` refuses (`"²".isdigit()` is true): no rank, never a ValueError
    assert launch_facts("export ORCH_NODE_RANK=\u00b2\nexport ORCH_MASTER_PORT=\u00b3\n") == (
        None, None, False,
    )  # fmt: skip


# --- the guard on a node -------------------------------------------------------------------------
class RunNode(Node):
    """A node whose run started (a live pid), with its launch script and log."""

    def start(self, rank: int, master: tuple[str, int] = ("127.0.0.1", 9)) -> None:
        text = script(rank=rank).replace("10.0.0.3", master[0]).replace("29511", str(master[1]))
        (self.run_dir / "launch.sh").write_text(text)
        (self.run_dir / "node.log").write_text("")
        self.training()

    def log(self, *lines: str) -> None:
        with (self.run_dir / "node.log").open("a") as log:
            log.write("".join(line + "\n" for line in lines))


def test_node_0s_guard_stops_a_stalled_run_and_a_start_without_progress(tmp_path: Path) -> None:
    node = RunNode(tmp_path, stall_timeout_s=30.0, start_timeout_s=20.0)
    node.heartbeat(age_s=3600)  # no controller: the guard acts at once
    now = time.time()
    node.start(rank=0)
    node.log(SETUP_RUNNING)
    assert node.guard.due(now + 1000) is None  # in its setup
    node.log(SETUP_DONE)
    assert node.guard.due(now + 1001) is None
    kind, since, message = node.guard.due(now + 1021)
    assert (kind, since) == ("start", now + 1021) and "no progress" in message
    node.log(step(1))
    assert node.guard.due(now + 1022) is None
    node.log(step(2), "[default0]:" + "x" * 100)
    assert node.guard.due(now + 1030) is None
    assert node.guard.due(now + 1059) is None
    kind, since, message = node.guard.due(now + 1060)
    assert (kind, since) == ("stall", now + 1060) and "step (2)" in message


def test_node_0s_guard_reads_the_newest_steps_of_a_log_that_grew_past_its_bound(
    tmp_path: Path,
) -> None:
    node = RunNode(tmp_path, stall_timeout_s=30.0)
    node.heartbeat(age_s=3600)
    now = time.time()
    node.start(rank=0)
    node.log(step(1))
    assert node.guard.due(now) is None
    node.log(*["[default0]:" + "noise " * 100] * (3 * READ_CHUNK // 600), step(2))
    assert node.guard.due(now + 29) is None  # step 2 read, though past the bound
    assert node.guard.due(now + 58) is None
    assert node.guard.due(now + 59)[0] == "stall"


def test_a_new_run_on_the_same_node_starts_a_new_clock(tmp_path: Path) -> None:
    node = RunNode(tmp_path, start_timeout_s=20.0)
    node.heartbeat(age_s=3600)
    now = time.time()
    node.start(rank=0)
    node.log(step(5))
    assert node.guard.due(now + 100) is None  # past its start, and no stall timeout
    (node.run_dir / "pid").write_text("1\n")  # the restart: another pid, still a step job
    os.utime(node.run_dir / "pid", (now + 100, now + 100))
    node.log("[default0]:loading")
    assert node.guard.due(now + 101) is None
    assert node.guard.due(now + 125)[0] == "start"


def test_without_either_timeout_the_guard_does_not_read_the_run(tmp_path: Path) -> None:
    node = RunNode(tmp_path)
    node.heartbeat(age_s=3600)
    node.start(rank=0)
    assert node.guard.due(time.time() + 10**6) is None
    assert node.guard.progress.offset is None


@pytest.fixture
def master() -> Iterator[socket.socket]:
    """A listening socket standing for torchrun's rendezvous store on node 0."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def test_another_node_follows_once_the_master_it_reached_stops_answering(
    tmp_path: Path, master: socket.socket
) -> None:
    node = RunNode(tmp_path, stall_timeout_s=600.0)
    node.start(rank=1, master=master.getsockname())
    node.heartbeat(age_s=1)  # the controller is alive: it decides
    now = time.time()
    assert node.guard.due(now) is None and node.guard.progress.seen
    master.close()
    for look in range(FOLLOW_LOOKS + 1):
        assert node.guard.due(now + look) is None  # not asked while the controller lives
    node.heartbeat(age_s=3600)
    for look in range(FOLLOW_LOOKS - 1):
        assert node.guard.due(now + look) is None
    kind, _, message = node.guard.due(now + FOLLOW_LOOKS)
    assert kind == ORPHANED and "stopped answering" in message


def test_another_node_fails_a_start_whose_master_never_answered(tmp_path: Path) -> None:
    node = RunNode(tmp_path, start_timeout_s=20.0)
    with socket.create_server(("127.0.0.1", 0)) as closed:
        where = closed.getsockname()
    node.start(rank=1, master=where)
    now = time.time()
    os.utime(node.run_dir / "pid", (now - 100, now - 100))  # started 100 s ago
    node.heartbeat(age_s=1)
    assert node.guard.due(now) is None  # a live controller judges node 0's start
    node.heartbeat(age_s=3600)
    kind, since, message = node.guard.due(now)
    assert (kind, since) == ("start", now - 80)
    assert f"{where[0]}:{where[1]} did not answer in 100 s" in message
