"""How the controller runs `orchestrator.node.set_aside` on a node (the node runtime's
`set-aside`), and reads its answers.

Pure: the command text, the requests, and parsers of what the node prints. A node's answer
comes from a machine the job's own code runs on, so nothing in it is trusted: a listed path
must be a safe checkpoint path (`checkpoint_protocol.safe_path`), a size a number; at most
`MAX_LISTED` paths are read; a moved entry counts only if the controller asked for it. What
does not fit is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from orchestrator.node import runtime
from orchestrator.node.checkpoint_agent import shown
from orchestrator.node.checkpoint_protocol import AgentLayout, safe_path
from orchestrator.node.launch import NodeLayout

MAX_LISTED = 100_000  # files one listing may name; beyond, the node's steps are not all known
MAX_OUTPUT_BYTES = 32 * 2**20  # a longer answer is not read


def folder(owner: str) -> str:
    """Where a node keeps what was set aside (home-relative): orch's own folder of the job
    (or kept cluster) `owner`, outside any checkpoint directory a spec can name but `~`."""
    return f"{NodeLayout(owner).root}/set-aside"


def list_command() -> str:
    """The runtime's `set-aside list` (stdin: `list_request(...)`); the node holds the runtime
    (`orchestrator.node.runtime`): the checkpoint agents were sent first."""
    return runtime.program_command("set-aside", "list")


def move_command() -> str:
    """The runtime's `set-aside move` (stdin: `move_request(...)`)."""
    return runtime.program_command("set-aside", "move")


def list_request(owner: str, checkpoint_dir: str, limit: int = MAX_LISTED) -> str:
    """What `list` lists: the checkpoint directory but orch's own folders on the node (the
    run's, the checkpoint agent's, what was set aside; all of `orch-jobs` when the checkpoint
    directory holds it, as the checkpoint agent leaves it out)."""
    node, agent = NodeLayout(owner), AgentLayout(owner)
    exclude = [node.run_dir, agent.root, folder(owner)]
    if not checkpoint_dir.startswith(node.root):
        exclude.append("orch-jobs")
    return json.dumps({"checkpoint_dir": checkpoint_dir, "exclude": exclude, "limit": limit})


def move_request(owner: str, checkpoint_dir: str, entries: Collection[str], tag: str) -> str:
    return json.dumps(
        {"checkpoint_dir": checkpoint_dir, "entries": sorted(entries), "to": folder(owner),
         "tag": tag}
    )  # fmt: skip


@dataclass(frozen=True)
class Listing:
    """One node's checkpoint files, as far as they could be read."""

    files: Mapping[str, int]  # path -> size
    complete: bool  # every file is here (none left out for the limit, none refused)


def _document(output: str) -> dict | None:
    if len(output) > MAX_OUTPUT_BYTES:
        return None
    lines = output.strip().splitlines()
    try:
        document = json.loads(lines[-1]) if lines else None
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def parse_listing(output: str) -> Listing | None:
    """The answer of `list`; None when the output is no listing."""
    document = _document(output)
    raw = document.get("files") if document is not None else None
    if not isinstance(raw, dict):
        return None
    files: dict[str, int] = {}
    complete = document.get("more") is False if document is not None else False
    for path, size in raw.items():
        if len(files) >= MAX_LISTED:
            complete = False
            break
        if safe_path(path) and isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            files[path] = size
        else:
            complete = False
    return Listing(files, complete)


@dataclass(frozen=True)
class Moves:
    """The answer of `move`, reduced to what was asked."""

    folder: str | None  # the folder's name under `folder(owner)`; None when none was made
    moved: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]  # (entry, why), `why` printable and short


def parse_moves(output: str, asked: Collection[str], tag: str) -> Moves:
    """The answer of `move` for the entries `asked`: an entry the node does not report as
    moved counts as failed."""
    document = _document(output) or {}
    name = document.get("folder")
    given = name if isinstance(name, str) and _is_folder_name(name, tag) else None
    reported = document.get("moved")
    moved = {e for e in reported if e in asked} if isinstance(reported, list) else set()
    why: dict[str, str] = {}
    for item in document.get("failed") or []:
        if isinstance(item, list) and len(item) == 2 and item[0] in asked:
            why[item[0]] = set_aside_reason(item[1])
    failed = tuple(
        (entry, why.get(entry, "the node did not say")) for entry in sorted(set(asked) - moved)
    )
    return Moves(given, tuple(sorted(moved)), failed)


def _is_folder_name(name: str, tag: str) -> bool:
    suffix = name[len(tag) :]
    return name.startswith(tag) and (suffix == "" or (suffix[:1] == "-" and suffix[1:].isdigit()))


def set_aside_reason(text: object) -> str:
    """A node's reason, printable (`checkpoint_agent.shown`) and at most 200 characters."""
    return shown(str(text), 200)
