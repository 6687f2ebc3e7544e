"""One interface for what the job commands ask of jobs, wherever the jobs live.

`Jobs` is what `orch submit`, `status JOB`, `status`, `cost`, `cancel` and `logs` call once
typer has parsed their arguments: `LocalJobs` (`control.verbs.local_jobs`) answers from this
ORCH_HOME's ledger, `HostJobs` (`control.verbs.host_jobs`) asks the controller host, one typed
request and reply per call (`control.verbs.job_wire`). A submit is
`schedule(submit_dryrun(request))`
(`submit`): the dry run checks and prepares everything, launching nothing; `schedule` hands the
prepared job on and returns its id. The commands render what comes back the same way for both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

View = Literal["status", "cost"]
Say = Callable[[str, bool], None]  # a line a command says as it goes, and whether on stderr


@dataclass(frozen=True)
class SubmitRequest:
    """`orch submit`'s options as typer parsed them (None: not given)."""

    job_file: Path
    nodes: int | None = None
    gpus: int | None = None
    provider: str | None = None
    fleet: str | None = None
    spot: bool | None = None
    max_cost: str | None = None
    idle_timeout: float | None = None
    env: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    notify: str | None = None
    cluster: str | None = None
    autostop: str | None = None
    no_wait: bool = False
    fresh: bool = False
    strict: bool = False
    yes: bool = False
    dry_run: bool = False
    json_out: bool = False

    def overrides(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """The spec's fields these options set (`spec.loading.assignment_overrides`)."""
        from orchestrator.spec.loading import assignment_overrides

        return {
            "resources.nodes": self.nodes,
            "resources.gpus_per_node": self.gpus,
            # --fleet alone means provider ssh: fleets are its machines
            "provider": self.provider or ("ssh" if self.fleet else None),
            "fleet": self.fleet,
            "resources.spot": self.spot,
            "budget.max_cost_usd": self.max_cost,
            "budget.idle_timeout": self.idle_timeout,
            **assignment_overrides("--env", "env", list(self.env), environ),
            **assignment_overrides("--secret", "secrets", list(self.secret), environ),
        }

    def argv(self) -> list[str]:
        """The same options as `orch submit` arguments, the spec file first. Pure."""
        args = [str(self.job_file)]
        valued = (("--nodes", self.nodes), ("--gpus", self.gpus), ("--provider", self.provider),
                  ("--fleet", self.fleet), ("--max-cost", self.max_cost),
                  ("--idle-timeout", self.idle_timeout))  # fmt: skip
        for flag, value in valued:
            if value is not None:
                args += [flag, str(value)]
        if self.spot is not None:
            args.append("--spot" if self.spot else "--no-spot")
        for item in self.env:
            args += ["--env", item]
        for item in self.secret:
            args += ["--secret", item]
        for flag, text in (("--notify", self.notify), ("--cluster", self.cluster),
                           ("--autostop", self.autostop)):  # fmt: skip
            if text is not None:
                args += [flag, text]
        switches = (("--no-wait", self.no_wait), ("--fresh", self.fresh),
                    ("--strict", self.strict), ("--yes", self.yes),
                    ("--dry-run", self.dry_run), ("--json", self.json_out))  # fmt: skip
        return args + [flag for flag, on in switches if on]


@dataclass(frozen=True)
class LogsRequest:
    """`orch logs`'s options as typer parsed them."""

    job_id: str
    rank: int | None = None
    node: int | None = None
    all_ranks: bool = False
    follow: bool = False
    tail: int | None = None
    since: datetime | None = None
    json_out: bool = False

    def argv(self) -> list[str]:
        """The same request as `orch logs` arguments. Pure."""
        args = ["logs", self.job_id]
        for flag, value in (("--rank", self.rank), ("--node", self.node), ("--tail", self.tail)):
            if value is not None:
                args += [flag, str(value)]
        if self.since is not None:
            args += ["--since", self.since.isoformat()]
        switches = (("--all-ranks", self.all_ranks), ("--follow", self.follow),
                    ("--json", self.json_out))  # fmt: skip
        return args + [flag for flag, on in switches if on]


@dataclass(frozen=True)
class CancelOutcome:
    """How a cancel ended: `route` (`control.verbs.cancel.CancelRoute`'s value), the job's final
    state, how many nodes the cancel itself ended, and what the job keeps, in words."""

    route: str
    state: str
    terminated: int
    kept: str

    def lines(self, job_id: str) -> list[str]:
        """What `orch cancel` prints of it. Pure."""
        if self.route == "already_ended":
            return [f"job {job_id} already ended: {self.state}"]
        if self.route in ("controller", "asked"):
            return [f"job {job_id}: {self.state}", self.kept]
        how = " by force" if self.route == "forced" else ""
        return [f"job {job_id}: CANCELLED{how} ({self.terminated} node(s) terminated)", self.kept]


DryRun = TypeVar("DryRun")


class Jobs(Protocol[DryRun]):
    """The jobs of one place (this ledger, or the controller host's). Every method raises an
    `OrchError` whose message says what to do when it cannot answer."""

    def submit_dryrun(self, request: SubmitRequest) -> DryRun:
        """Check and prepare the job of `request`; launches nothing."""
        ...

    def schedule(self, dryrun: DryRun) -> str:
        """Hand the prepared job to its controller; returns the job's id."""
        ...

    def describe(self, job_id: str) -> dict[str, Any]:
        """`orch status JOB --json`'s document of the job."""
        ...

    def list(self, view: View) -> dict[str, Any]:
        """`orch status --json` (`view="status"`) or `orch cost --json`'s document."""
        ...

    def cancel(self, job_id: str, *, force: bool, say: Say) -> CancelOutcome:
        """Cancel the job (see `control.verbs.cancel`), saying what it does as it goes."""
        ...

    def logs(self, request: LogsRequest, write: Callable[[str], None], say: Say) -> int:
        """Print the job's log lines (`write`, each with its newline); returns the exit
        status."""
        ...

    def cost(self, job_id: str) -> dict[str, Any]:
        """`orch cost --job JOB --json`'s document."""
        ...


def submit(jobs: Jobs[DryRun], request: SubmitRequest) -> str:
    """Submit the job of `request` on `jobs`: `schedule(submit_dryrun(request))`."""
    return jobs.schedule(jobs.submit_dryrun(request))
