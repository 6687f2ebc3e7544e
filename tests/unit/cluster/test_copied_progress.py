"""A controller that adopts a run takes up the newest step in rank 0's log copy: the controller
that died may have read steps it had not yet written to the ledger (it writes a job's step every
2 s), and the adopting watch goes on after those lines without reading them again. Only this
node's part of the copy counts, only rank 0's lines, and a line cut by the bounded read is not
taken for a step."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cluster.run_watch import copied_progress
from orchestrator.node.progress import Metrics


def step_line(step: int, rank: int = 0, loss: float = 1.0) -> str:
    return f"[default{rank}]:" + json.dumps({"step": step, "loss": loss}) + "\n"


def copied(logs: Path, pattern: str | None = None, limit: int = 256 * 1024) -> Metrics | None:
    return copied_progress(logs, "i-new", progress_pattern=pattern, limit=limit)


def test_the_newest_step_of_rank_0_in_the_copy_is_taken_up(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / ".starts").mkdir()
    (logs / ".starts" / "i-new").write_text("0")
    text = "[orch] launching\n" + "".join(step_line(s) for s in range(1, 29))
    text += step_line(99, rank=1) + "[default0]:plain output\n"
    (logs / "node-0.log").write_text(text)
    newest = copied(logs)
    assert newest is not None and newest.step == 28 and newest.loss == 1.0


def test_an_earlier_nodes_part_of_the_copy_does_not_count(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    earlier = "".join(step_line(s) for s in range(1, 50))  # a node of this rank, reclaimed
    (logs / ".starts").mkdir(parents=True)
    (logs / ".starts" / "i-new").write_text(str(len(earlier)))
    (logs / "node-0.log").write_text(earlier + "[orch] launching\n")
    assert copied(logs) is None  # nothing of its own yet
    with (logs / "node-0.log").open("a") as log:
        log.write(step_line(40))
    newest = copied(logs)
    assert newest is not None and newest.step == 40


def test_a_node_never_watched_has_nothing_copied(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node-0.log").write_text(step_line(7))  # another node's: this one has no start
    assert copied(logs) is None


def test_a_line_cut_by_the_bounded_read_is_not_a_step(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / ".starts").mkdir(parents=True)
    (logs / ".starts" / "i-new").write_text("0")
    last = "[default0]:at step 123456\n"
    (logs / "node-0.log").write_text("x" * 5000 + "\n" + last)
    pattern = r"step (?P<step>\d+)"
    # The read starts inside `last`: "3456" must not be read as step 3456.
    assert copied(logs, pattern, limit=len(last) - 14) is None
    newest = copied(logs, pattern, limit=len(last) + 10)
    assert newest is not None and newest.step == 123456
