"""Naming the step of a launch that failed on the nodes, and what to do about it.

A job's start is a chain of node-side steps (the reset of a kept node, the sync, sending and
arming the checkpoint agents, putting a checkpoint back, the start itself). A `RemoteError` out
of one of them says what the node answered; `node_step` puts the step in front of it and,
where the error has no advice of its own, the step's. The error keeps its class, so whoever
tells a lost node from a failed command still can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from orchestrator.errors import RemoteError


@contextlib.contextmanager
def node_step(step: str, hint: str) -> Iterator[None]:
    """Run the body as the step `step` ("sync of the workdir"): a `RemoteError` out of
    it reads "STEP failed: WHAT THE NODE SAID", with `hint` as its advice unless it had one.
    An error already named by a step (a step inside another) keeps its name."""
    try:
        yield
    except RemoteError as exc:
        if exc.step is None:
            exc.step = step
            exc.message = f"{step} failed: {exc.message}"
            exc.hint = exc.hint or hint
        raise
