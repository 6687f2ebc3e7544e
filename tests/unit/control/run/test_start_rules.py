"""A start that made no progress: what each node answers (`node.start_report`, its script run
here against a real run folder and this machine's real TCP table) and the reason the nodes'
answers give (`control.run.start_rules`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from orchestrator.control.money.stop_rules import STALLED_EXIT, guard_limit_at, stall_order
from orchestrator.control.run.start_rules import hang_reason, may_restart, ranks_of
from orchestrator.job_state import JobState
from orchestrator.node.launch import NodeLayout
from orchestrator.node.start_report import (
    START_MARK,
    NodeStart,
    parse_report,
    report_command,
)

IPS = ["10.0.0.3", "10.0.0.4", "10.0.0.5"]


def node(**fields: object) -> NodeStart:
    base: dict = dict(
        workers=False, alive=True, setup=None, peers=(), to_master=None, tail=("last line",)
    )
    base.update(fields)
    return NodeStart(**base)


def reason(reports: dict, master: str | None = "10.0.0.3:29500", ppn: int = 2) -> str:
    return hang_reason(
        reports,
        node_ips=IPS[: len(reports)],
        master=master,
        procs_per_node=ppn,
        waited_s=21.4,
        start_timeout_s=20,
    ).reason


def test_the_reason_names_the_ranks_that_never_reached_the_master() -> None:
    text = reason({0: node(peers=("10.0.0.5",)), 1: node(to_master="syn-sent"), 2: node()})
    assert text.startswith(
        "the start made no progress in 21 s (recovery.start_timeout 20 s): ranks 2-3 on node 1 "
        "never reached the master 10.0.0.3:29500 (its connection to the master waits in SYN-SENT"
    )
    assert "node 2" not in text  # node 0 holds its connection: it reached the master
    assert "Docker's FORWARD policy" in text


def test_the_reason_says_why_a_node_never_got_there() -> None:
    assert (
        "rank 1 on node 1 never reached the master 10.0.0.3:29500 (it is still in its setup)"
        in (reason({0: node(), 1: node(setup="running")}, ppn=1))
    )
    assert "(its run ended)" in reason({0: node(), 1: node(alive=False)})
    assert "(the node did not answer)" in reason({0: node(), 1: None})


def test_a_rendezvous_that_passed_puts_the_hang_on_rank_0() -> None:
    passed = {0: node(workers=True), 1: node(workers=True, to_master="established")}
    assert "every node's ranks passed the rendezvous at 10.0.0.3:29500, but rank 0 made" in (
        reason(passed)
    )
    reached = {0: node(peers=("10.0.0.4",)), 1: node(to_master="established")}
    assert "torchrun did not start the workers of node(s) 0, 1" in reason(reached)
    assert "rank 0 printed nothing" in reason({}, master=None)


def test_the_details_hold_each_nodes_last_lines() -> None:
    failed = hang_reason(
        {0: node(tail=("a", "b", "c", "d")), 1: None},
        node_ips=IPS[:2], master="10.0.0.3:29500", procs_per_node=1, waited_s=20,
        start_timeout_s=20,
    )  # fmt: skip
    assert failed.details == "node 0: b | c | d; node 1: did not answer"


def test_a_failed_start_is_restarted_once_on_the_same_nodes() -> None:
    assert may_restart(0) and not may_restart(1)
    assert ranks_of(1, 1) == "rank 1" and ranks_of(2, 4) == "ranks 8-11"


def test_a_stall_stops_the_job_as_stalled_with_its_own_exit_code() -> None:
    assert stall_order(quiet_s=29.9, stall_timeout_s=30, step=7) is None
    assert stall_order(quiet_s=99, stall_timeout_s=None, step=7) is None
    order = stall_order(quiet_s=30.2, stall_timeout_s=30, step=7)
    assert order is not None
    assert (order.state, order.exit_code) == (JobState.STALLED, STALLED_EXIT)
    assert STALLED_EXIT not in (0, 1, 2, 3, 4, 130)
    assert "stayed at step 7 for 30 s" in order.reason
    silent = stall_order(quiet_s=31, stall_timeout_s=30, step=None)
    assert silent is not None and "printed nothing" in silent.reason


def test_a_node_that_ended_itself_with_a_stall_timeout_set_is_put_down_to_it() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    base = dict(
        at=at, started_at=at, max_runtime_s=None, spend=Decimal(0), max_cost=None,
        reserve_usd=Decimal(0), idle_timeout_s=None,
    )  # fmt: skip
    assert guard_limit_at(**base) == "deadman"
    assert guard_limit_at(**base, stall_timeout_s=60) == "stall"
    assert guard_limit_at(**{**base, "idle_timeout_s": 60}, stall_timeout_s=60) == "idle"


# --- the node's answer ---------------------------------------------------------------------------
def test_the_parser_keeps_only_what_it_expects() -> None:
    doc = {
        "workers": "yes",
        "alive": True,
        "setup": "rm -rf /",
        "peers": ["10.0.0.4", "not an address", 7, "::1"] + ["10.0.0.9"] * 100,
        "to_master": "listening",
        "tail": ["x" * 1000] * 20,
    }
    report = parse_report(f"noise\n{START_MARK} {json.dumps(doc)}\n")
    assert report is not None
    assert (report.workers, report.alive, report.setup, report.to_master) == (
        False, True, None, None,
    )  # fmt: skip
    assert report.peers[:2] == ("10.0.0.4", "::1") and len(report.peers) <= 64
    assert len(report.tail) == 6 and all(len(line) == 300 for line in report.tail)
    assert parse_report("nothing marked") is None
    assert parse_report(f"{START_MARK} " + "[" * 100_000) is None
    assert parse_report(f"{START_MARK} [1, 2]") is None


def test_the_report_script_reads_a_run_folder_and_the_tcp_table(tmp_path: Path) -> None:
    layout = NodeLayout("j-1")
    run = tmp_path / layout.run_dir
    (run / "ranks" / "j-1_abc" / "attempt_0").mkdir(parents=True)
    (run / "pid").write_text(f"{os.getpid()}\n")
    (run / "node.log").write_text("[orch] setup: running\n[orch] setup: done\n\n[default0]:hi\n")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        try:
            # As node 1 sees it: its own connection to the master 127.0.0.1:port.
            own = answer(tmp_path, layout, "127.0.0.1", port)
            # As node 0 sees it: a peer holds a connection to its master port.
            peer = answer(tmp_path, layout, "127.0.0.2", port)
        finally:
            client.close()
            accepted.close()
    assert own.workers and own.alive and own.setup == "done"
    assert own.tail[-1] == "[default0]:hi"
    assert own.to_master == "established" and "127.0.0.1" not in own.peers
    assert peer.peers == ("127.0.0.1",) and peer.to_master is None
    (run / "ranks" / "j-1_abc" / "attempt_0").rmdir()
    (run / "pid").write_text("not a pid\n")
    empty = answer(tmp_path, layout, "127.0.0.1", 9)
    assert not empty.workers and not empty.alive


def answer(home: Path, layout: NodeLayout, addr: str, port: int) -> NodeStart:
    result = subprocess.run(
        ["bash", "-c", report_command(layout, addr, port)],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    report = parse_report(result.stdout)
    assert report is not None, result.stdout + result.stderr
    return report
