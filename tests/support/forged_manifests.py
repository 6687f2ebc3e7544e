"""What job code on a node can do to its checkpoint agent's manifest: stop the agent and write
the manifest the controller reads. Used on real local nodes (`checkpoint_nodes.keeper_nodes`).
"""

from __future__ import annotations

import json

from orchestrator.node.checkpoint_protocol import AgentLayout
from orchestrator.node.launch import home_expr
from tests.support.checkpoint_nodes import KeeperNodes


def _root(nodes: KeeperNodes) -> str:
    return home_expr(AgentLayout(nodes.job_id).root)


def freeze_agent(nodes: KeeperNodes, rank: int = 0) -> None:
    """Stop the agent (it still counts as alive) so that it writes no manifest of its own."""
    nodes.run(rank, f'kill -STOP "$(cat {_root(nodes)}/pid)"')


def thaw_agent(nodes: KeeperNodes, rank: int = 0) -> None:
    nodes.run(rank, f'kill -CONT "$(cat {_root(nodes)}/pid)"')


def read_manifest(nodes: KeeperNodes, rank: int = 0) -> dict:
    return json.loads(nodes.run(rank, f"cat {_root(nodes)}/manifest.json"))


def write_manifest(nodes: KeeperNodes, document: dict, rank: int = 0) -> None:
    """Replace the manifest as the agent does (atomically)."""
    nodes.cluster.connections[rank].run(
        f"cd {_root(nodes)} && cat > manifest.json.tmp && mv -f manifest.json.tmp manifest.json",
        stdin=json.dumps(document),
    )


def staged_entry(digest: str, *, stored: object = None, size: int = 1) -> dict:
    """A manifest entry of a settled file with a staged copy (named after its digest)."""
    return {
        "size": size,
        "mtime_ns": 5,
        "staged": {"digest": digest, "size": size, "mtime_ns": 5, "ctime_ns": 6,
                   "object": digest, "linked": False, "stored": stored},
    }  # fmt: skip


def manifest(files: dict, generation: int, *, dcp: dict | None = None) -> dict:
    return {"version": 1, "generation": generation, "done": False, "run_ended": False,
            "files": files, "dcp": dcp or {}, "problems": []}  # fmt: skip
