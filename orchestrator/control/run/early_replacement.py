"""Launching the replacement of a noticed node at once, while its emergency checkpoint is saved.

A spot notice gives the node a deadline (two minutes on EC2). Its replacement need not wait
until the run has stopped, rank 0 has written the emergency checkpoint, the controller has
pulled it and the node has ended: it is launched as soon as the notice is seen, in the
survivors' zone, of their type and market, and gets the workdir and the data while the salvage
runs. When the salvage is done the restart waits for nothing but the replacement's share of
the checkpoint. On a cloud the boot and the copy fall inside the notice window.

Billing: the replacement's lease opens at its launch, so for the seconds of the salvage the job
bills one node more than it has ranks; the noticed node ends right after the salvage, as
before. A controller that dies meanwhile leaves two nodes for one rank: the next one keeps the
node the run was started on and ends the other (`split_duplicate_ranks`).

Only for a notice, a run that keeps its survivors (`recovery.replace: lost`, not a kept
cluster) and no spot policy (which may want another market after the salvage). A failed
early launch is no failure of the job: the replacement is then launched after the salvage, as
without a notice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from orchestrator.errors import OrchError
from orchestrator.providers.base import Instance


class EarlyLaunch:
    """Replacements launched in the background for the nodes `survivors` lack.

    `future` is the launch and the copy: its result the replacements, ready; its exception an
    `OrchError` where they failed (no failure of the job), anything else a bug. `launched`
    lists every node the launch made as soon as it made them (leases already open), so that
    whoever ends the job's nodes can find them even when the copy failed."""

    def __init__(self, survivors: Sequence[Instance]) -> None:
        self.survivors = list(survivors)
        self.launched: list[Instance] = []
        self.future: Future[list[Instance]] = Future()

    @classmethod
    def start(
        cls,
        survivors: Sequence[Instance],
        launch: Callable[[Callable[[list[Instance]], None]], list[Instance]],
        prepare: Callable[[list[Instance]], None],
    ) -> EarlyLaunch:
        """Run `launch` (given a callback that takes the nodes the moment they exist; returns
        them with their leases open), then `prepare` on them (the copy of the workdir and the
        data), in a background thread."""
        early = cls(survivors)

        def keep(instances: list[Instance]) -> None:
            early.launched = list(instances)

        def work() -> list[Instance]:
            keep(launch(keep))
            prepare(early.launched)
            return early.launched

        pool = ThreadPoolExecutor(1, thread_name_prefix="orch-early-replacement")
        early.future = pool.submit(work)
        pool.shutdown(wait=False)  # the thread ends with the work
        return early

    @property
    def error(self) -> OrchError | None:
        """Why the launch or the copy failed (None: they did not); waits for them."""
        error = self.future.exception()
        return error if isinstance(error, OrchError) else None

    def wait(self) -> None:
        """Block until the launch and the copy ended, whichever way; a bug in them (not an
        `OrchError`) is raised here."""
        error = self.future.exception()
        if error is not None and not isinstance(error, OrchError):
            raise error

    def usable_for(self, survivors: Sequence[Instance]) -> list[Instance] | None:
        """The replacements, once ready, when they were launched for exactly these
        `survivors` and the launch and copy succeeded; None otherwise (the caller ends what
        `launched` holds and launches again)."""
        self.wait()
        same = {i.instance_id for i in survivors} == {i.instance_id for i in self.survivors}
        if self.error is not None or not same or not self.launched:
            return None
        return self.launched


def split_duplicate_ranks(instances: Sequence[Instance]) -> tuple[list[Instance], list[Instance]]:
    """(one node per rank, the others): of nodes sharing a rank, the first launched stays,
    the run was started on it; the later ones are replacements launched early by a controller
    that died before it restarted the run on them."""
    keep: dict[int, Instance] = {}
    extra: list[Instance] = []
    for instance in sorted(instances, key=lambda i: (i.rank, i.launched_at, i.instance_id)):
        if instance.rank in keep:
            extra.append(instance)
        else:
            keep[instance.rank] = instance
    return list(keep.values()), extra
