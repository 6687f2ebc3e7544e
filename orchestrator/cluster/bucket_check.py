"""Whether a job's buckets are there, asked from this machine before anything is launched.

`check_buckets` looks at each bucket source (`data[i].src: s3://...`) and each output's bucket
(`outputs[i].dst`) with boto3, this machine's credentials chain and `Settings.store`'s endpoint
and region, and returns one plain `BucketFinding` each; it never raises for what the service
answers. A source is found when HeadObject finds its key (one object), else when
ListObjectsV2 finds an object under `key/` (a prefix; the whole bucket for an empty key); an
output's bucket when HeadBucket finds it. With `count`, a prefix's objects and bytes are
summed, up to `max_count` objects (then `at_least`).

What a finding means for the submit depends on whose credentials the nodes use
(`BucketFinding.severity`): nodes with credentials of their own (an instance role) may read
what this machine may not, so "access denied" and "no credentials" here only warn; nodes that
get this machine's credentials (the local provider) would fail the same way, so those refuse.
A missing bucket or prefix always refuses; an endpoint this machine cannot reach only warns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from orchestrator.config import Settings
from orchestrator.spec.model import JobSpec
from orchestrator.spec.mounts import split_bucket_url

Outcome = Literal[
    "found", "missing-bucket", "missing", "denied", "no-credentials", "unreachable", "unknown"
]
Severity = Literal["ok", "warning", "error"]

MAX_COUNT = 100_000
"""The most objects a dry run counts under one prefix before it says "at least"."""
MAX_DETAIL = 200  # characters of the service's own words kept in a finding
_DENIED = {
    "403", "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "InvalidToken", "ExpiredToken", "AccountProblem",
}  # fmt: skip
_NO_BUCKET = {"NoSuchBucket"}
_NO_KEY = {"404", "NoSuchKey", "NotFound"}


@dataclass(frozen=True)
class BucketFinding:
    """What this machine found at one bucket URL of the spec."""

    place: str  # the spec's field: data[0].src, outputs[1].dst
    url: str  # the normalized s3:// URL
    outcome: Outcome
    found: Literal["object", "prefix", "bucket"] | None = None  # what is there, when found
    objects: int | None = None  # objects counted (a source found, when counted)
    bytes: int | None = None  # their bytes
    at_least: bool = False  # the count stopped at its bound: there are more
    detail: str = ""  # the service's words, bounded (an error's code and message)

    @property
    def is_output(self) -> bool:
        return self.place.startswith("outputs")

    def severity(self, nodes_have_credentials: bool) -> Severity:
        """ok, warning (said, the submit goes on) or error (the submit is refused)."""
        if self.outcome == "found":
            return "ok"
        if self.outcome in ("missing-bucket", "missing"):
            return "error"
        if self.outcome in ("denied", "no-credentials"):
            return "warning" if nodes_have_credentials else "error"
        return "warning"

    def message(self, nodes_have_credentials: bool) -> str:
        """One line naming the field and the URL, what was found and what to do."""
        bucket, key = split_bucket_url(self.url)
        where = f"{self.place} {self.url}"
        needs = (
            "s3:ListBucket and s3:PutObject" if self.is_output else "s3:GetObject and s3:ListBucket"
        )
        if self.outcome == "found":
            return f"{where}: found ({self.found})"
        if self.outcome == "missing-bucket":
            return f"{where}: bucket {bucket} does not exist: check its name, or create it"
        if self.outcome == "missing":
            under = f"no object {key} and nothing under {self.url}/" if key else "it is empty"
            return f"{where}: {under}: check the key or prefix (aws s3 ls {self.url}/)"
        said = (
            "access denied to this machine's AWS credentials"
            if self.outcome == "denied"
            else "this machine has no AWS credentials"
        )
        if self.outcome == "denied" and not nodes_have_credentials:
            return (
                f"{where}: {said}, which the nodes use too: grant them {needs} on it, or run "
                "orch with credentials that have them"
            )
        if self.outcome == "no-credentials" and not nodes_have_credentials:
            return (
                f"{where}: {said}, and the nodes would use this machine's: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            )
        if self.outcome in ("denied", "no-credentials"):
            return f"{where}: {said}; the nodes will try with their own instance role"
        if self.outcome == "unreachable":
            return (
                f"{where}: cannot tell whether it is there: the S3 endpoint is out of this "
                f"machine's reach ({self.detail}); the nodes will try themselves"
            )
        return f"{where}: cannot tell whether it is there ({self.detail}); the nodes will try"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bucket_places(spec: JobSpec) -> list[tuple[str, str]]:
    """(place, URL) of every bucket the spec names: its bucket sources, then its outputs."""
    sources = [(f"data[{i}].src", m.bucket_url) for i, m in enumerate(spec.data) if m.bucket_url]
    outputs = [(f"outputs[{i}].dst", o.dst) for i, o in enumerate(spec.outputs)]
    return [(place, url) for place, url in (*sources, *outputs) if url]


def check_buckets(
    spec: JobSpec, settings: Settings, *, count: bool = False, max_count: int = MAX_COUNT
) -> list[BucketFinding]:
    """One finding per bucket the spec names (`bucket_places`), in that order; [] without
    any (boto3 is not even imported then). Never raises for what S3 answers."""
    places = bucket_places(spec)
    if not places:
        return []
    import boto3  # here: boto3 takes a third of a second to import
    from botocore.config import Config

    region = settings.store.region or (spec.resources.region or [None])[0]
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=settings.store.endpoint_url,
        region_name=region,
        config=Config(
            connect_timeout=5, read_timeout=15, retries={"max_attempts": 2, "mode": "standard"}
        ),
    )
    found = []
    for place, url in places:
        check = _output if place.startswith("outputs") else _source
        try:
            found.append(check(client, place, url, count=count, max_count=max_count))
        except Exception as exc:  # noqa: BLE001 - botocore's errors share no base with ClientError
            found.append(BucketFinding(place, url, _outcome(exc), detail=_detail(exc)))
    return found


def _source(client: Any, place: str, url: str, *, count: bool, max_count: int) -> BucketFinding:
    bucket, key = split_bucket_url(url)
    if key:
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:  # noqa: BLE001
            if _code(exc) not in _NO_KEY | _DENIED:
                raise
            # 403: no GetObject on it, or no such key without ListBucket; the listing tells
        else:
            size = int(head.get("ContentLength", 0))
            return BucketFinding(place, url, "found", "object", 1, size)
    prefix = f"{key}/" if key else ""
    first = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    if not first.get("Contents"):
        return BucketFinding(place, url, "missing")
    if not count:
        return BucketFinding(place, url, "found", "prefix")
    objects, size, at_least = _count(
        client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix),
        max_count,
    )
    return BucketFinding(place, url, "found", "prefix", objects, size, at_least)


def _count(pages: Iterable[dict[str, Any]], max_count: int) -> tuple[int, int, bool]:
    """(objects, bytes, whether more were left uncounted) over listing pages."""
    objects = size = 0
    for page in pages:
        for item in page.get("Contents", []):
            if objects >= max_count:
                return objects, size, True
            objects += 1
            size += int(item.get("Size", 0))
    return objects, size, False


def _output(client: Any, place: str, url: str, *, count: bool, max_count: int) -> BucketFinding:
    bucket, _key = split_bucket_url(url)
    client.head_bucket(Bucket=bucket)
    return BucketFinding(place, url, "found", "bucket")


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def _outcome(exc: BaseException) -> Outcome:
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return "no-credentials"
    if isinstance(
        exc,
        EndpointConnectionError | ConnectTimeoutError | ReadTimeoutError | ConnectionClosedError,
    ):
        return "unreachable"
    code = _code(exc)
    if code in _NO_BUCKET or (code in _NO_KEY and "HeadBucket" in str(exc)):
        return "missing-bucket"
    if code in _DENIED:
        return "denied"
    return "unknown"


def _detail(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."
