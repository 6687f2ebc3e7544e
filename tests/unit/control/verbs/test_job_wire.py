"""What `HostJobs` reads of the controller host's reply (`control.verbs.job_wire`): a bounded JSON
object of the reply's shape, every job id in it of the job-id shape and the one asked about;
anything else is refused with a `ControllerHostError` saying what was wrong. Pure."""

from __future__ import annotations

import json

import pytest

from orchestrator.control.verbs import job_wire
from orchestrator.control.verbs.job_wire import (
    CancelRequest,
    CostRequest,
    DescribeRequest,
    ListRequest,
    read_reply,
    read_request,
)
from orchestrator.errors import ControllerHostError

JOB = "train-0a1b2c"
OTHER = "train-ffffff"


def reply(**fields: object) -> str:
    return json.dumps(fields)


def test_a_request_reads_back_as_written() -> None:
    for request in (DescribeRequest(job_id=JOB), ListRequest(view="cost"),
                    CostRequest(job_id=JOB), CancelRequest(job_id=JOB, force=True)):  # fmt: skip
        assert read_request(request.model_dump_json()) == request


@pytest.mark.parametrize(
    "text",
    [
        '{"kind": "describe", "job_id": "../../etc"}',
        '{"kind": "drop", "job_id": "train-0a1b2c"}',
        '{"kind": "list", "view": "status", "sql": "1"}',
        "not json",
    ],  # fmt: skip
)
def test_a_request_out_of_shape_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a jobs request"):
        read_request(text)


def test_a_described_job_comes_back_with_what_the_host_said() -> None:
    document = {"id": JOB, "state": "RUNNING", "step": 12, "events": [{"kind": "x"}]}
    got = read_reply(reply(document=document), DescribeRequest(job_id=JOB))
    assert got.document == document and got.failure is None


def test_an_oversized_reply_is_refused_before_it_is_parsed() -> None:
    big = reply(document={"id": JOB, "state": "RUNNING", "pad": "x" * job_wire.MAX_REPLY_BYTES})
    with pytest.raises(ControllerHostError, match="bytes, more than"):
        read_reply(big, DescribeRequest(job_id=JOB))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "refused"),
        ("[1, 2]", "refused"),
        (reply(document={"id": JOB, "state": "RUNNING"}, extra=1), "extra"),
        (reply(), "neither a document nor a failure"),
        (reply(document={"id": OTHER, "state": "RUNNING"}), "describes job 'train-ffffff'"),
        (reply(document={"id": "../../keys", "state": "RUNNING"}), "not a job id"),
        (reply(document={"id": JOB, "state": "x" * (job_wire.MAX_TEXT + 1)}), "state"),
        (reply(document={"id": JOB}), "state"),
        (reply(failure={"message": "no", "exit_code": 0}), "exit_code"),
        (reply(failure={"message": "no", "exit_code": 999}), "exit_code"),
        (
            reply(
                document={"id": JOB, "state": "RUNNING"},
                said=[{"text": "x"}] * (job_wire.MAX_SAID + 1),
            ),
            "said",
        ),  # fmt: skip
    ],
)
def test_a_malformed_reply_is_refused_saying_what_was_wrong(text: str, says: str) -> None:
    with pytest.raises(ControllerHostError, match="answer to `describe` was refused") as refused:
        read_reply(text, DescribeRequest(job_id=JOB))
    assert says in str(refused.value)


def test_a_listing_with_a_row_whose_id_is_no_job_id_is_refused() -> None:
    rows = [{"id": JOB, "state": "RUNNING"}, {"id": "/etc/passwd", "state": "RUNNING"}]
    with pytest.raises(ControllerHostError, match=r"jobs\.1\.id.*not a job id"):
        read_reply(reply(document={"jobs": rows}), ListRequest(view="status"))
    too_many = [{"id": JOB}] * (job_wire.MAX_ROWS + 1)
    with pytest.raises(ControllerHostError, match="jobs"):
        read_reply(reply(document={"jobs": too_many}), ListRequest(view="cost"))
    fine = read_reply(
        reply(document={"jobs": rows[:1], "total_usd": 1.5}), ListRequest(view="cost")
    )
    assert fine.document == {"jobs": rows[:1], "total_usd": 1.5}


def test_one_jobs_bill_names_only_that_job() -> None:
    with pytest.raises(ControllerHostError, match="bills jobs other than"):
        read_reply(reply(document={"jobs": [{"id": OTHER}]}), CostRequest(job_id=JOB))


def test_a_cancel_says_how_it_ended_in_known_words_only() -> None:
    request = CancelRequest(job_id=JOB)
    outcome = {"route": "no_controller", "state": "CANCELLED", "terminated": 2, "kept": "none"}
    said = [{"text": "cancelling", "err": False}]
    got = read_reply(reply(document=outcome, said=said), request)
    assert got.document == outcome and got.said[0].text == "cancelling"
    with pytest.raises(ControllerHostError, match="route"):
        read_reply(reply(document={**outcome, "route": "rm -rf"}), request)
    with pytest.raises(ControllerHostError, match="terminated"):
        read_reply(reply(document={**outcome, "terminated": -1}), request)


def test_a_refusal_is_a_reply_too_and_round_trips() -> None:
    refusal = job_wire.Reply(failure=job_wire.Failure(message="no job x", exit_code=2))
    got = read_reply(job_wire.write_reply(refusal), DescribeRequest(job_id=JOB))
    assert got.failure == job_wire.Failure(message="no job x", exit_code=2)
