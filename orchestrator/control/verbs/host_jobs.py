"""`HostJobs`: the jobs this ORCH_HOME submitted to its controller host (see
`control.verbs.jobs.Jobs`), asked there.

Each call is one request (`control.verbs.job_wire`) written to the stdin of the host's hidden `orch
controller answer`, which answers it from the host's own `LocalJobs`; its reply is read up to
`job_wire.MAX_REPLY_BYTES` and checked before anything of it is used. A submit sends the spec,
workdir and secrets as `host.remote_jobs.submit` does, and a job's logs come as they are
printed (`host.remote_jobs.stream`): a followed log has no end to wait for.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.control.verbs import job_wire
from orchestrator.control.verbs.jobs import CancelOutcome, LogsRequest, Say, SubmitRequest, View
from orchestrator.errors import ControllerHostError, OrchError, SpecError

if TYPE_CHECKING:
    from orchestrator.config import Settings

ANSWER = ("controller", "answer")  # the host's hidden command that answers one request


class HostRefused(OrchError):
    """The host's orch refused or failed a request: what it printed and its exit status, for
    the command to pass on as they are."""

    def __init__(self, stdout: str, stderr: str, exit_code: int) -> None:
        super().__init__(stderr.strip() or f"the controller host's orch exited {exit_code}")
        self.stdout, self.stderr, self.exit_code = stdout, stderr, exit_code


@dataclass(frozen=True)
class HostSubmission:
    """A submit checked here: the host's `orch submit` arguments (spec file first)."""

    argv: tuple[str, ...]
    json_out: bool


class HostJobs:
    """The jobs `settings`' ORCH_HOME submitted to its controller host. `stderr` receives
    what the host's orch said on stderr beside an answer (warnings, revived controllers)."""

    def __init__(self, settings: Settings, stderr: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self._stderr = stderr or (lambda text: None)
        self.submitted_output = ""  # what the host's `orch submit` printed, after `schedule`

    # --- one request, one reply ---------------------------------------------------------------

    def _ask(self, request: job_wire.Request, *, timeout: float) -> job_wire.Reply:
        from orchestrator.host import record as records
        from orchestrator.host.layout import orch_command
        from orchestrator.host.session import HostSession

        session = HostSession(self.settings.home, records.require(self.settings.home))
        try:
            result = session.run(
                orch_command(session.layout, ANSWER),
                check=False,
                stdin=request.model_dump_json(),
                timeout=timeout,
                max_output=job_wire.MAX_REPLY_BYTES + 1,
            )
        finally:
            session.close()
        if result.cut:
            raise ControllerHostError(
                f"the controller host's answer to `{request.kind}` was refused: longer than "
                f"the {job_wire.MAX_REPLY_BYTES} bytes orch reads"
            )
        if not result.stdout.strip() and not result.ok:  # its orch failed before answering
            raise HostRefused(result.stdout, result.stderr, result.exited)
        reply = job_wire.read_reply(result.stdout, request)
        self._stderr(result.stderr)
        if reply.failure is not None:
            raise HostRefused("", f"error: {reply.failure.message}\n", reply.failure.exit_code)
        assert reply.document is not None  # read_reply: a document unless a failure
        return reply

    def describe(self, job_id: str) -> dict[str, Any]:
        from orchestrator.host.remote_jobs import refresh_kit

        with suppress(OrchError):  # the host's answer says what is wrong
            refresh_kit(self.settings, job_id)  # a kit the submit left without the job's key
        request = job_wire.DescribeRequest(job_id=job_id)
        return dict(self._ask(request, timeout=300).document or {})

    def list(self, view: View) -> dict[str, Any]:
        return dict(self._ask(job_wire.ListRequest(view=view), timeout=60).document or {})

    def cost(self, job_id: str) -> dict[str, Any]:
        return dict(self._ask(job_wire.CostRequest(job_id=job_id), timeout=300).document or {})

    def cancel(self, job_id: str, *, force: bool, say: Say) -> CancelOutcome:
        reply = self._ask(job_wire.CancelRequest(job_id=job_id, force=force), timeout=3600)
        for line in reply.said:
            say(line.text, line.err)
        return CancelOutcome(**(reply.document or {}))

    # --- streams and files ----------------------------------------------------------------------

    def logs(self, request: LogsRequest, write: Callable[[str], None], say: Say) -> int:
        """The host's `orch logs` of the request, passed through as it comes: a job's whole log
        can be far larger than a reply, and a followed one has no end. Returns its status."""
        from orchestrator.host.remote_jobs import stream

        return stream(self.settings, request.argv())

    def submit_dryrun(self, request: SubmitRequest) -> HostSubmission:
        """Check what can be checked here (the spec file reads, each secret has a value), and
        the host's `orch submit` arguments."""
        import os

        import yaml

        from orchestrator.host import record as records
        from orchestrator.host.submission import split_args

        records.require(self.settings.home)
        argv = request.argv()
        try:
            yaml.safe_load(Path(argv[0]).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise SpecError(f"cannot read the job spec {argv[0]}: {exc}") from exc
        split_args(argv, 0, os.environ)  # refuses a --secret NAME unset here
        return HostSubmission(tuple(argv), request.json_out)

    def schedule(self, dryrun: HostSubmission) -> str:
        """Send the job to the host (`remote_jobs.submit`); returns its id, checked against the
        job-id shape. The host's refusal raises `HostRefused` with what it printed."""
        import os

        from orchestrator.host.remote_jobs import submit

        job_id, result = submit(self.settings, list(dryrun.argv), 0, dict(os.environ))
        if not result.ok:
            raise HostRefused(result.stdout, result.stderr, result.exited)
        self.submitted_output = result.stdout
        return job_id


def lives_on_host(home: Path, job_id: str) -> bool:
    """Whether `job_id` is a job this ORCH_HOME submitted to its controller host: one small
    file read (host.json), no settings and no SSH."""
    from orchestrator.host.record import load

    record = load(home)
    return record is not None and job_id in record.jobs
