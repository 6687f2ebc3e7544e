"""How the controller has a node remove a job's own files (`orchestrator.node.clear_files`):
between two jobs on a kept cluster (`reset_command`), and the workdir files a `--fresh`
submit leaves out (`fresh_command`). Pure: command text and the parser of the answer.

What a reset removes, on the node of a kept cluster `owner` (`~/orch-jobs/<owner>`):

- the last run's folder and its checkpoint agent's state, whole;
- the job's default checkpoint directory (no `checkpoint.dir`), whole: nothing else is there;
- a `checkpoint.dir` inside the workdir (`.`, `./`, `ckpt`) or elsewhere in the job's folder:
  only the files the last job's checkpoint agent listed as its checkpoints (what the run wrote
  or changed there, and what orch put back), never the workdir's other files nor a folder;
- a `checkpoint.dir` outside the job's folder (`~`, `~/ckpt`, an absolute path, a symlink that
  leads out): nothing. Those files are the user's, and the next job sees them.

The workdir stays (the sync sends only what changed) and so does the setup marker.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.node import clear_files
from orchestrator.node.launch import NodeLayout, home_expr

MANIFEST = "manifest.json"  # the checkpoint agent's (`checkpoint_agent.MANIFEST`)
AGENT_DIR = "checkpoint-agent"  # below the job's folder (`checkpoint_protocol.AgentLayout`)


def clear_command(request: dict[str, object]) -> str:
    """`clear_files.py REQUEST` on a node, its source on the command line."""
    source = Path(clear_files.__file__).read_text()
    return f"python3 -c {shlex.quote(source)} {shlex.quote(json.dumps(request))}"


def reset_request(layout: NodeLayout, checkpoint_dir: str | None) -> dict[str, object]:
    """What a kept node clears of its last job before the next one (see the module
    docstring); `checkpoint_dir` as `NodeLayout.node_path` gives it."""
    agent = f"{layout.root}/{AGENT_DIR}"
    return {
        "root": layout.root,
        "remove": [layout.run_dir, agent, layout.default_checkpoint_dir],
        "dir": checkpoint_dir or layout.default_checkpoint_dir,
        "manifest": f"{agent}/{MANIFEST}",
        "paths": [],
    }


def reset_command(layout: NodeLayout, checkpoint_dir: str | None) -> str:
    """Shell command that clears what a kept node holds of its last job (`reset_request`),
    then touches the new run's heartbeat: the controller that reset the node is alive, and
    the node's guard takes it so (without it, a job that came just before the autostop was
    due saw its node power off meanwhile)."""
    heartbeat = home_expr(f"{layout.run_dir}/heartbeat")
    return (
        f"{clear_command(reset_request(layout, checkpoint_dir))} && "
        f"mkdir -p {home_expr(layout.run_dir)} && touch {heartbeat}"
    )


def fresh_command(layout: NodeLayout, paths: Sequence[str]) -> str:
    """Shell command that removes the workdir files `paths` (relative to it) on a node:
    those a `--fresh` submit leaves out, which a kept node may hold from an earlier sync."""
    return clear_command(
        {
            "root": layout.root,
            "remove": [],
            "dir": layout.workdir,
            "manifest": None,
            "paths": list(paths),
        }  # fmt: skip
    )


@dataclass(frozen=True)
class Cleared:
    """A node's answer: how many named files it removed, and what it made of the folder
    (`clear_files.clear_rule`: files, whole, outside; none when there was nothing)."""

    removed: int
    dir: str


def parse_cleared(output: str) -> Cleared:
    """The answer's last line; anything unreadable counts as nothing removed (a node's output
    is data: only a count and one of the known words are taken)."""
    lines = output.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
        removed = answer.get("removed")
        made = answer.get("dir")
    except (ValueError, AttributeError):
        return Cleared(0, "none")
    count = removed if isinstance(removed, int) and 0 <= removed < 10**9 else 0
    return Cleared(count, made if made in ("files", "whole", "outside") else "none")
