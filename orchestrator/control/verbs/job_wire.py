"""What `HostJobs` and the controller host's `orch controller answer` say to each other: one
JSON request on the command's stdin, one JSON reply on its stdout. Pure.

The host is not trusted: a reply is read only up to `MAX_REPLY_BYTES`, must be one JSON object
of the shape below (strings, lists and numbers bounded), and every job id in it must have the
job-id shape (`spec.ids`), the same id as asked where one was asked. Anything else raises
`ControllerHostError` naming what was wrong, and nothing of it is used.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from orchestrator.errors import ControllerHostError
from orchestrator.spec.ids import is_job_id

MAX_REPLY_BYTES = 8 * 1024 * 1024  # a listing of 10,000 jobs is about 4 MiB
MAX_ROWS = 20_000  # jobs in one listing
MAX_SAID = 64  # lines a cancel says before its outcome
MAX_TEXT = 4096  # characters of one line, message or state

Text = Annotated[str, Field(max_length=MAX_TEXT)]


def _job_id(value: object) -> str:
    if not is_job_id(value):
        raise ValueError(f"{repr(value)[:80]} is not a job id")
    return str(value)


JobId = Annotated[str, AfterValidator(_job_id)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- requests ---------------------------------------------------------------------------------


class DescribeRequest(_Strict):
    """`orch status JOB --json`: the job's document."""

    kind: Literal["describe"] = "describe"
    job_id: JobId


class ListRequest(_Strict):
    """`orch status --json` (`view="status"`) or `orch cost --json` (`view="cost"`)."""

    kind: Literal["list"] = "list"
    view: Literal["status", "cost"]


class CostRequest(_Strict):
    """`orch cost --job JOB --json`: one job's bill."""

    kind: Literal["cost"] = "cost"
    job_id: JobId


class CancelRequest(_Strict):
    """`orch cancel JOB [--force]`."""

    kind: Literal["cancel"] = "cancel"
    job_id: JobId
    force: bool = False


Request = Annotated[
    DescribeRequest | ListRequest | CostRequest | CancelRequest, Field(discriminator="kind")
]
_REQUEST: TypeAdapter[Request] = TypeAdapter(Request)


def read_request(text: str) -> Request:
    """The request `text` holds (the host's side: it comes from this ORCH_HOME's owner, yet is
    checked all the same); raises ValueError for anything else."""
    try:
        return _REQUEST.validate_json(text)
    except ValidationError as exc:
        raise ValueError(f"not a jobs request: {exc.errors()[0]['msg']}") from None


# --- replies ----------------------------------------------------------------------------------


class Said(_Strict):
    """A line the host's command said (`err`: on stderr) before its outcome."""

    text: Text
    err: bool = False


class Failure(_Strict):
    """The host's orch refused or failed: its message and exit status."""

    message: Text
    exit_code: int = Field(ge=1, le=255)


class Reply(_Strict):
    """One answer: `document` (the command's JSON document) unless `failure`; `said`, the lines
    a cancel says as it goes."""

    document: dict[str, Any] | None = None
    said: list[Said] = Field(default_factory=list, max_length=MAX_SAID)
    failure: Failure | None = None


class _Row(BaseModel):
    """A row of a listing: whatever the command shows, with a job id of the job-id shape."""

    model_config = ConfigDict(extra="allow", frozen=True)
    id: JobId


class _Listing(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    jobs: list[_Row] = Field(max_length=MAX_ROWS)


class _Job(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    id: JobId
    state: Text


class _Cancelled(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    route: Literal["already_ended", "controller", "asked", "no_controller", "forced"]
    state: Text
    terminated: int = Field(ge=0, le=100_000)
    kept: Text


def _refused(what: str, why: str) -> ControllerHostError:
    return ControllerHostError(
        f"the controller host's answer to {what} was refused: {why}",
        hint="the host's orch may be another version or broken: `orch controller status` shows "
        "its version, `orch controller logs` its daemon's log",
    )


def read_reply(data: bytes | str, request: Request) -> Reply:
    """The host's reply to `request`, checked (see the module docstring): its size, its
    shape, and the job ids in it. Raises `ControllerHostError` saying what was wrong."""
    what = f"`{request.kind}`"
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_REPLY_BYTES:
        raise _refused(what, f"{len(raw)} bytes, more than the {MAX_REPLY_BYTES} orch reads")
    try:
        reply = Reply.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the reply"
        raise _refused(what, f"{where}: {first['msg']}") from None
    if reply.failure is not None:
        return reply
    if reply.document is None:
        raise _refused(what, "it holds neither a document nor a failure")
    try:
        _check_document(request, reply.document)
    except (ValidationError, ValueError) as exc:
        raise _refused(what, _first_error(exc)) from None
    return reply


def _first_error(exc: ValidationError | ValueError) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc)


def _check_document(request: Request, document: dict[str, Any]) -> None:
    if isinstance(request, ListRequest):
        _Listing.model_validate(document)
    elif isinstance(request, DescribeRequest):
        job = _Job.model_validate(document)
        if job.id != request.job_id:
            raise ValueError(f"it describes job {job.id!r}, not {request.job_id!r}")
    elif isinstance(request, CostRequest):
        listing = _Listing.model_validate(document)
        if any(row.id != request.job_id for row in listing.jobs):
            raise ValueError(f"it bills jobs other than {request.job_id!r}")
    else:
        _Cancelled.model_validate(document)


def write_reply(reply: Reply) -> str:
    """The reply as the host prints it: one line of JSON."""
    return reply.model_dump_json(exclude_none=True)


def document_of(data: dict[str, Any]) -> dict[str, Any]:
    """A JSON document made of plain values (`json.dumps(default=str)`'s reading of it), as
    the command would have printed it."""
    loaded: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return loaded
