"""The reason of a failed run, read from real torchrun output.

tests/fixtures/torchrun_root_cause.log is the node log of `torchrun --nproc_per_node=2
--redirects=3 --tee=3 --no-python bash -c 'python fail.py'` (torchrun's venv path shortened):
local rank 1 raises a chained ValueError; torchrun then SIGTERMs rank 0, whose handler raises a
RuntimeError of its own, printed later; torchrun's ChildFailedError report names rank 1.

tests/fixtures/torchrun_ddp_node{0,1}.log are the two node logs of one gloo DDP world of four
(two torchruns, two processes each, an all_reduce every step): rank 3 on node 1 raises at step
20; its peers then fail in all_reduce ("Connection reset by peer"), node 0's two seconds later.
torch.distributed prefixes an uncaught exception's lines with `[rank<N>]: `.

tests/fixtures/torchrun_missing_script_node{0,1}.log are the two node logs of `run: python
train.py` in a workdir that holds multinode.py, as orch starts it (two torchruns, two processes
each, `--no-python bash -c 'python train.py'` in the workdir; venv paths shortened): every rank
prints python's `can't open file` and nothing else, and each torchrun raises ChildFailedError.
"""

from __future__ import annotations

from orchestrator.node.failure import (
    EXIT_ABORT_HINT,
    TAIL_LINES,
    cluster_failure,
    failed_at,
    failure_report,
    find_failure,
    last_exception,
    peer_lost,
)
from tests.support.helpers import REPO

FIXTURES = REPO / "tests" / "fixtures"
SAMPLE = (FIXTURES / "torchrun_root_cause.log").read_text()
DDP = {node: (FIXTURES / f"torchrun_ddp_node{node}.log").read_text() for node in (0, 1)}
MISSING = {
    node: (FIXTURES / f"torchrun_missing_script_node{node}.log").read_text() for node in (0, 1)
}
CANT_OPEN = (
    "python: can't open file '/root/orch-jobs/tutorial-3f9c1a/workdir/train.py': "
    "[Errno 2] No such file or directory"
)
BOOM = "RuntimeError: boom: CUDA out of memory (simulated)"
WHAT = "torchrun exited with code 1"


def test_the_root_cause_rank_is_chosen_over_a_later_exception() -> None:
    failure = find_failure(SAMPLE)
    assert failure is not None
    assert (failure.local_rank, failure.rank, failure.exit_code) == (1, 1, 1)
    assert failure.error == "ValueError: boom: bad batch shape [3, 224]"
    # The traceback is the raised exception's own block, ending with its line.
    assert failure.traceback[0] == "Traceback (most recent call last):"
    assert failure.traceback[-1] == failure.error
    assert any("fail2.py" in line and "line 15" in line for line in failure.traceback)


def test_the_report_puts_the_scripts_error_line_first() -> None:
    report = failure_report(0, WHAT, SAMPLE)
    lines = report.splitlines()
    assert lines[0] == "rank 1 (node 0): ValueError: boom: bad batch shape [3, 224]"
    assert lines[1] == f"node 0: {WHAT}"
    # torchrun's own report is still there, at the end: the log's last lines.
    assert lines[-TAIL_LINES:] == SAMPLE.rstrip().splitlines()[-TAIL_LINES:]
    assert "bash FAILED" in report and "ChildFailedError" not in lines[0]


def test_a_node_log_with_a_prefix_on_other_nodes_names_the_global_rank() -> None:
    # On node 1 of two with two processes each, local rank 1 is global rank 3.
    log = SAMPLE.replace("rank      : 1 (local_rank: 1)", "rank      : 3 (local_rank: 1)")
    assert failure_report(1, WHAT, log).splitlines()[0] == (
        "rank 3 (node 1): ValueError: boom: bad batch shape [3, 224]"
    )


def test_a_run_without_an_exception_keeps_the_plain_reason() -> None:
    # `exit 3` on every rank: torchrun's report names the rank, which printed no exception.
    log = "\n".join(
        [
            "[default0]:about to fail with a clear reason",
            *SAMPLE.splitlines()[SAMPLE.splitlines().index("Traceback (most recent call last):") :],
        ]
    ).replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    failure = find_failure(log)
    assert failure is not None and failure.error is None and failure.local_rank == 0
    report = failure_report(0, "torchrun exited with code 3", log)
    assert report.splitlines()[0] == "node 0: torchrun exited with code 3"


def test_without_torchruns_report_the_last_rank_to_raise_is_chosen() -> None:
    # torchrun itself was killed before it could report: no ChildFailedError block.
    cut = SAMPLE.index("E1204")
    failure = find_failure(SAMPLE[:cut])
    assert failure is not None and failure.local_rank == 0 and failure.rank is None
    assert failure.error == "RuntimeError: rank 0 stopped by torchrun"
    assert failure_report(0, WHAT, SAMPLE[:cut]).startswith(
        "node 0, local rank 0: RuntimeError: rank 0 stopped by torchrun\n"
    )


def test_a_log_without_rank_prefixes_is_read_whole() -> None:
    # launcher: none, where the run's output is not prefixed.
    log = 'loading\nTraceback (most recent call last):\n  File "x.py", line 1\nOSError: disk full\n'
    failure = find_failure(log)
    assert failure is not None and failure.error == "OSError: disk full"
    assert failure_report(0, "the run exited with code 1", log).startswith(
        "node 0: OSError: disk full\n"
    )
    assert find_failure("all good\n") is None


def test_exception_lines() -> None:
    assert last_exception(["torch.OutOfMemoryError: CUDA out of memory."])[0] == (
        "torch.OutOfMemoryError: CUDA out of memory."
    )
    assert last_exception(["KeyboardInterrupt"])[0] == "KeyboardInterrupt"
    # A traceback ends with whatever name is raised, even one not ending in Error.
    block = ["Traceback (most recent call last):", '  File "t.py", line 2', "Boom: no"]
    assert last_exception(block) == ("Boom: no", tuple(block))
    # Progress lines and torchrun's own exception are not the script's error.
    assert last_exception(['{"step": 3, "loss": 1.5}', "loss: 0.5"]) == (None, ())
    launcher = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
    assert last_exception(["Traceback (most recent call last):", "  File", launcher]) == (None, ())


def test_torch_distributeds_rank_prefix_is_taken_off() -> None:
    failure = find_failure(DDP[1])
    assert failure is not None and (failure.local_rank, failure.rank) == (1, 3)
    assert failure.exit_code == -6  # SIGABRT, after the traceback was printed
    assert failure.error == BOOM
    assert failure.traceback[0] == "Traceback (most recent call last):"
    # Node 0's ranks failed only because a peer went away.
    peer = find_failure(DDP[0])
    assert peer is not None and peer.rank == 0 and peer.error is not None
    assert "Connection reset by peer" in peer.error


def test_the_node_that_failed_first_gives_the_reason() -> None:
    assert failed_at(DDP[1]) == "1204 19:10:35.510000"
    assert failed_at(DDP[0]) == "1204 19:10:37.466000"
    assert failed_at("[default0]:still training\n") is None
    # The watch saw node 0 exit (lowest node first), but node 1 failed first.
    node, reason = cluster_failure(DDP, 0, 1)
    lines = reason.splitlines()
    assert node == 1 and lines[0] == f"rank 3 (node 1): {BOOM}"
    assert lines[1] == (
        "node 1: a worker failed here first, at 19:10:35.510000 "
        "(node 0: torchrun exited with code 1)"
    )
    assert "Connection reset by peer" not in reason.split("--- last lines")[0]
    # Node 1 seen first: its own report, as it is.
    assert cluster_failure(DDP, 1, 1) == (
        1,
        failure_report(1, "torchrun exited with code 1", DDP[1]),
    )
    # No torchrun report anywhere (a lost log): node `rank`'s log, whatever it holds.
    assert cluster_failure({0: "", 1: ""}, 1, 3) == (
        1,
        failure_report(1, "torchrun exited with code 3", ""),
    )


def test_a_node_that_only_lost_its_peer_never_hides_the_peers_own_error() -> None:
    """On a loaded machine node 0's torchrun may see its rank fail (on a reset connection)
    before node 1's torchrun sees the rank that raised, or before it printed so at all."""
    early = DDP[0].replace("1204 19:10:37.466000", "1204 19:10:35.100000")
    assert failed_at(early) == "1204 19:10:35.100000" < failed_at(DDP[1])  # type: ignore[operator]
    assert peer_lost(early) and not peer_lost(DDP[1])
    node, reason = cluster_failure({0: early, 1: DDP[1]}, 0, 1)
    assert node == 1 and reason.splitlines()[0] == f"rank 3 (node 1): {BOOM}"
    assert reason.splitlines()[1].startswith("node 1: a worker failed here first, at 19:10:35.51")
    # Node 1's torchrun had not yet printed that its worker failed: its rank's error still wins.
    unseen = "\n".join(line for line in DDP[1].splitlines() if failed_at(line) is None)
    assert failed_at(unseen) is None
    node, reason = cluster_failure({0: early, 1: unseen}, 0, 1)
    assert node == 1 and reason.splitlines()[:2] == [
        f"rank 3 (node 1): {BOOM}",
        "node 1: a worker failed here first (node 0: torchrun exited with code 1)",
    ]
    # Every node lost a peer (the one that died left no error): the first seen, as before.
    assert cluster_failure({0: early, 1: DDP[0]}, 1, 1)[0] == 0


def test_an_abort_at_exit_is_named_with_a_hint() -> None:
    # tests/fixtures/torchrun_exit_abort.log: the docs/spot.md script without its os._exit,
    # under torchrun --tee=3; local rank 1 printed its last line, then aborted in shutdown.
    log = (FIXTURES / "torchrun_exit_abort.log").read_text()
    failure = find_failure(log)
    assert failure is not None and (failure.rank, failure.exit_code) == (1, -6)
    assert failure.error == "aborted (SIGABRT): terminate called without an active exception"
    lines = failure_report(0, "torchrun exited with code 1", log).splitlines()
    assert lines[0] == f"rank 1 (node 0): {failure.error}"
    assert lines[1] == EXIT_ABORT_HINT and "os._exit" in lines[1]
    # The same abort line from a rank that torchrun's report does not name is no reason.
    other = log.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)", 1)
    other = other.replace("exitcode  : -6 (pid: 14972)  (SIGABRT)", "exitcode  : 1 (pid: 1)")
    assert EXIT_ABORT_HINT not in failure_report(0, "torchrun exited with code 1", other)


def test_a_report_carries_no_control_character_of_the_node_log() -> None:
    """A report reaches the terminal and the ledger (PostgreSQL refuses NUL): a node's escape
    sequences and NULs become U+FFFD, the rest of the report is as before."""
    log = SAMPLE.replace("ValueError: boom", "ValueError: \x1b[2J\x00boom\x07")
    report = failure_report(0, WHAT, log)
    error = "rank 1 (node 0): ValueError: \ufffd[2J\ufffdboom\ufffd: bad batch shape [3, 224]"
    assert report.splitlines()[0] == error
    assert not any(c in report for c in "\x00\x07\x1b\r")
    assert report.replace("\ufffd[2J\ufffdboom\ufffd", "boom") == failure_report(0, WHAT, SAMPLE)


def test_a_script_that_is_not_there_is_the_headline_and_torchruns_trace_stays_in_the_log() -> None:
    # Node 1's torchrun saw its worker fail first: its rank 2 (local rank 0) is the headline.
    node, reason = cluster_failure(MISSING, 0, 1)
    lines = reason.splitlines()
    assert node == 1 and lines[0] == f"rank 2 (node 1): {CANT_OPEN}"
    assert lines[1].startswith("node 1: a worker failed here first, at 18:07:12.")
    # The ranks' own lines are shown; torchrun's traceback and report are left to the log.
    assert f"[default1]:{CANT_OPEN}" in lines
    assert "ChildFailedError" not in reason and "bash FAILED" not in reason
    assert lines[2] == (
        "--- last lines of node 1's log, torchrun's own traceback left out (orch logs shows it) ---"
    )
    # Node 0 alone reads the same.
    assert failure_report(0, WHAT, MISSING[0]).splitlines()[0] == f"rank 0 (node 0): {CANT_OPEN}"
    failure = find_failure(MISSING[0])
    assert failure is not None and (failure.rank, failure.error, failure.early) == (
        0,
        CANT_OPEN,
        True,
    )


def rank_failed(*own: str, rank: int = 0) -> str:
    """A node log whose local rank `rank` printed `own`, then torchrun's report of it."""
    report = MISSING[0].splitlines()[6:]  # from torchrun's `failed (exitcode: 2)` line on
    report = [line.replace("rank      : 0 (local_rank: 0)", f"rank      : {rank} (local_rank: 0)")
              for line in report]  # fmt: skip
    return "\n".join([*(f"[default0]:{line}" for line in own), *report]) + "\n"


def test_failures_before_the_first_line_of_output_are_named_by_the_rank_s_own_line() -> None:
    no_module = "/opt/venv/bin/python: No module named trainr"
    not_found = "bash: line 1: pyhton: command not found"
    no_dir = "bash: line 1: cd: sub: No such file or directory"
    for line in (no_module, not_found, no_dir):
        report = failure_report(0, WHAT, rank_failed(line))
        assert report.splitlines()[0] == f"rank 0 (node 0): {line}"
        assert "ChildFailedError" not in report
    # An import that fails at startup: the exception is the headline, the trace left out.
    startup = ["Traceback (most recent call last):", '  File "/w/train.py", line 1, in <module>',
               "    import wandb", "ModuleNotFoundError: No module named 'wandb'"]  # fmt: skip
    report = failure_report(0, WHAT, rank_failed(*startup))
    assert report.splitlines()[0] == "rank 0 (node 0): ModuleNotFoundError: No module named 'wandb'"
    assert "ChildFailedError" not in report


def test_a_run_that_printed_first_keeps_torchruns_report_in_its_tail() -> None:
    log = rank_failed("epoch 1 loss 0.3", "ValueError: bad batch")
    report = failure_report(0, WHAT, log)
    assert report.splitlines()[0] == "rank 0 (node 0): ValueError: bad batch"
    assert "bash FAILED" in report  # as before: the log's last lines, whatever they are
    # A last line of the usual kind after progress is still the rank's own error.
    cant = "python: can't open file '/w/eval.py': [Errno 2] No such file or directory"
    failure = find_failure(rank_failed("epoch 1 loss 0.3", cant))
    assert failure is not None and (failure.error, failure.early) == (cant, False)
    assert "bash FAILED" in failure_report(0, WHAT, rank_failed("epoch 1 loss 0.3", cant))
    # Progress and then nothing recognisable: no error is made up.
    failure = find_failure(rank_failed("epoch 1 loss 0.3", "saving to /tmp/x"))
    assert failure is not None and failure.error is None


def test_a_setup_that_cannot_find_its_script_is_named() -> None:
    log = (
        "[orch] setup: running\n"
        "bash: line 1: ./prepare.sh: No such file or directory\n"
        "[orch] setup failed with exit code 127\n"
    )
    assert failure_report(0, "the setup command failed", log).splitlines()[:2] == [
        "node 0: bash: line 1: ./prepare.sh: No such file or directory",
        "node 0: the setup command failed",
    ]
