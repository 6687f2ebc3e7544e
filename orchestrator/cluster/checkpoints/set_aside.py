"""Before a restart, move out of sight on every node the steps that are newer than the one the
run resumes and not whole on every node (the rule: `resume_point.set_aside_plan`).

Two SSH commands per node, on all nodes at once: a listing of the checkpoint directory, then
the moves the rule asks for (`orchestrator.node.set_aside`). What is moved is kept on its
node, under `~/orch-jobs/<job>/set-aside/<UTC time>/`, with its path below the checkpoint
directory; the caller writes an event per node that names it. A node that cannot be listed or
moved is a problem to report, not a failed restart: the run starts, and a load that fails is
what `orchestrator.control.run.resume_fallback` answers.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestrator.cluster.checkpoints.resume_point import set_aside_plan
from orchestrator.cluster.connections import Cluster
from orchestrator.errors import OrchError
from orchestrator.node.set_aside_protocol import (
    MAX_OUTPUT_BYTES,
    Listing,
    Moves,
    folder,
    list_command,
    list_request,
    move_command,
    move_request,
    parse_listing,
    parse_moves,
)
from orchestrator.remote.ssh import NodeConnection

COMMAND_TIMEOUT_S = 600.0  # a listing of a huge directory, or a copy to another filesystem


@dataclass(frozen=True)
class SetAside:
    """What a restart moved aside, by node."""

    folder: str  # home-relative, on every node: the job's set-aside folder
    moved: dict[int, Moves] = field(default_factory=dict)  # nodes that had something to move
    unlisted: dict[int, str] = field(default_factory=dict)  # nodes not listed whole, and why

    def events(self, resume: str | None) -> list[tuple[str, str]]:
        """The job's events (kind, message) that say what was done, the run resuming
        `resume`: a SET_ASIDE per node that moved something, naming it and where it is; a
        WARNING per node not listed whole and per entry that could not be moved."""
        reason = (
            f"newer than the resume point ({resume})"
            if resume
            else "not whole on every node, and the run resumes no directory checkpoint"
        )
        found: list[tuple[str, str]] = []
        for rank, why in sorted(self.unlisted.items()):
            found.append(
                ("WARNING", f"node {rank}: its checkpoint directory could not be listed whole "
                 f"({why}); only steps newer than {resume or 'none'} were looked for")
            )  # fmt: skip
        for rank, moves in sorted(self.moved.items()):
            if moves.moved:
                where = f"~/{self.folder}/{moves.folder}" if moves.folder else f"~/{self.folder}"
                found.append(
                    ("SET_ASIDE", f"node {rank}: {_names(moves.moved)} moved to {where}: "
                     f"{reason}, so that no script resumes it; kept there while the node runs")
                )  # fmt: skip
            for entry, why in moves.failed:
                found.append(
                    ("WARNING", f"node {rank}: {entry} could not be set aside ({why}); a "
                     "script that resumes the newest step it finds may find it")
                )  # fmt: skip
        return found


def _names(entries: tuple[str, ...], shown: int = 8) -> str:
    listed = ", ".join(entries[:shown])
    return listed + (f" and {len(entries) - shown} more" if len(entries) > shown else "")


def set_aside_newer(
    cluster: Cluster,
    *,
    owner: str,
    checkpoint_dir: str,
    resume: str | None,
    held_back: Collection[str] = (),
) -> SetAside:
    """List every node's checkpoint directory, then move aside what `set_aside_plan` names
    (see the module docstring). `resume`: the directory checkpoint the run resumes, relative
    to `checkpoint_dir` (None: none); `held_back`: checkpoints a run could not load."""
    listing_command, listing = list_command(), list_request(owner, checkpoint_dir)

    def list_node(rank: int, connection: NodeConnection) -> Listing | str:
        try:
            result = connection.run(
                listing_command, stdin=listing, timeout=COMMAND_TIMEOUT_S, check=False,
                max_output=MAX_OUTPUT_BYTES,
            )  # fmt: skip
        except OrchError as exc:
            return str(exc)
        parsed = parse_listing(result.stdout) if result.exited == 0 else None
        return parsed if parsed is not None else f"no listing (exit {result.exited})"

    answers = cluster.map(list_node)
    listings = {rank: a for rank, a in enumerate(answers) if isinstance(a, Listing)}
    unlisted = {rank: a for rank, a in enumerate(answers) if isinstance(a, str)}
    for rank, answer in listings.items():
        if not answer.complete:
            unlisted[rank] = "more files than one listing holds, or names orch does not take"
    plan = set_aside_plan(
        {rank: a.files for rank, a in listings.items()}, resume=resume, known=not unlisted,
        held_back=held_back,
    )  # fmt: skip
    if not plan:
        return SetAside(folder(owner), {}, unlisted)
    tag = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    moving = move_command()

    def move_node(rank: int, connection: NodeConnection) -> Moves | None:
        entries = plan.get(rank)
        if not entries:
            return None
        request = move_request(owner, checkpoint_dir, entries, tag)
        try:
            result = connection.run(moving, stdin=request, timeout=COMMAND_TIMEOUT_S, check=False)
        except OrchError as exc:
            return Moves(None, (), tuple((entry, str(exc)) for entry in entries))
        return parse_moves(result.stdout, entries, tag)

    moves = cluster.map(move_node)
    moved = {rank: m for rank, m in enumerate(moves) if m is not None}
    return SetAside(folder(owner), moved, unlisted)
