"""The pure part of `bucket-data`: which keys may become paths, what the untrusted manifest may
say, and what a fetch keeps, downloads and removes."""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import ClientError, NoCredentialsError

from orchestrator.node import bucket_plan as bp
from orchestrator.node.bucket_data import classify
from orchestrator.node.bucket_transfer import _Run


@pytest.mark.parametrize(
    "rel",
    ["", "/etc/passwd", "a/../b", "..", "./a", "a/./b", "a//b", "a/", "a\nb", "a\x7fb",
     "x" * 1025, "é" * 513],
)  # fmt: skip
def test_a_key_that_is_no_plain_relative_path_is_refused(rel: str) -> None:
    with pytest.raises(bp.Refused) as refused:
        bp.check_relative(rel)
    assert refused.value.kind == "key"
    assert len(str(refused.value)) < 200  # the key is shown bounded


def test_plain_relative_paths_pass() -> None:
    assert bp.check_relative("a/b c/d.bin") == "a/b c/d.bin"
    assert bp.check_relative("..a/b..") == "..a/b.."
    assert bp.check_relative("x" * 1024) == "x" * 1024


def test_keys_are_taken_relative_to_the_prefix_and_folder_markers_need_no_file() -> None:
    assert bp.relative_key("ds/a/b", "ds") == "a/b"
    assert bp.relative_key("a/b", "") == "a/b"
    with pytest.raises(bp.Refused):
        bp.relative_key("other/a", "ds")
    with pytest.raises(bp.Refused):
        bp.relative_key("ds/", "ds")


def test_a_path_that_is_both_a_file_and_a_folder_is_refused() -> None:
    bp.check_tree(["a/b", "a/c", "ab"])
    with pytest.raises(bp.Refused, match="both a file and a folder"):
        bp.check_tree(["a/b/c", "a/b"])


def test_urls_are_parsed_and_normalized() -> None:
    assert bp.parse_url("s3://b/p/q/") == ("b", "p/q")
    assert bp.parse_url("s3://b") == ("b", "")
    assert bp.normal_url("b", "") == "s3://b"
    for bad in ("gs://b/p", "s3:///p", 7):
        with pytest.raises(bp.Refused):
            bp.parse_url(bad)


def entry(etag: str = '"e"', size: int = 10, mtime: int = 5) -> dict:
    return {"etag": etag, "size": size, "local_size": size, "mtime_ns": mtime}


def test_the_manifest_keeps_only_well_formed_entries_of_safe_paths() -> None:
    document = {
        "url": "s3://b/p",
        "complete": True,
        "files": {
            "ok": entry(),
            "../../.ssh/authorized_keys": entry(),
            "/etc/passwd": entry(),
            "": entry(),
            "bad-size": {**entry(), "size": -1},
            "bool": {**entry(), "size": True},
            "no-etag": {"size": 1, "local_size": 1, "mtime_ns": 1},
        },
    }
    manifest = bp.read_manifest(document, single=False)
    assert manifest == {"url": "s3://b/p", "complete": True, "files": {"ok": entry()}}
    assert bp.read_manifest(document, single=True)["files"] == {"": entry()}
    assert bp.read_manifest(None, single=False) == {"url": None, "complete": False, "files": {}}
    assert bp.read_manifest({"files": [1], "complete": "yes"}, single=False)["complete"] is False


def test_the_plan_keeps_what_matches_and_removes_only_what_the_manifest_lists() -> None:
    manifest = {
        "url": "s3://b/p",
        "complete": True,
        "files": {
            "same": entry(),
            "new-etag": entry(),
            "touched": entry(),
            "gone": entry(),
            "gone-too": entry(),
        },
    }
    listing = {"same": ('"e"', 10), "new-etag": ('"f"', 10), "touched": ('"e"', 10),
               "fresh": ('"e"', 3)}  # fmt: skip
    local = {"same": (10, 5), "new-etag": (10, 5), "touched": (10, 6), "gone": (10, 5),
             "gone-too": None}  # fmt: skip
    assert bp.plan(listing, manifest, "s3://b/p", local) == (
        ["fresh", "new-etag", "touched"], ["same"], ["gone", "gone-too"],
    )  # fmt: skip
    # another source at the same place: nothing is taken as cached
    assert bp.plan(listing, manifest, "s3://b/q", local)[1] == []


def test_status_is_complete_only_for_its_url_with_every_file_unchanged() -> None:
    manifest = {"url": "s3://b/p", "complete": True, "files": {"a": entry(), "b": entry()}}
    local = {"a": (10, 5), "b": (10, 5)}
    assert bp.status(manifest, "s3://b/p", local) == {"complete": True, "objects": 2, "bytes": 20}
    assert bp.status(manifest, "s3://b/q", local)["complete"] is False
    assert bp.status(manifest, "s3://b/p", {**local, "b": None})["complete"] is False
    assert bp.status({**manifest, "complete": False}, "s3://b/p", local)["complete"] is False


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "ListObjectsV2")


def test_boto3_errors_get_the_kinds_the_controller_reads() -> None:
    assert classify(client_error("NoSuchBucket"), "s3://b/p").kind == "missing"
    denied = classify(client_error("AccessDenied"), "s3://b/p")
    assert denied.kind == "denied" and "s3://b/p" in str(denied)
    assert classify(NoCredentialsError(), "s3://b/p").kind == "denied"
    assert classify(OSError(28, "No space left on device"), "s3://b/p").kind == "disk"
    assert classify(client_error("SlowDown"), "s3://b/p").kind == "other"


def test_progress_is_told_at_most_once_a_second_while_transfers_run() -> None:
    lines: list[dict] = []
    ticks: list[int] = []
    run = _Run(300, 3, lines.append, lambda: ticks.append(1))
    assert run.room(1)
    run.add(100)
    ender = threading.Timer(1.5, run.ended, args=(None,))
    ender.start()
    started = time.monotonic()
    assert run.room(1)  # waits for the first to end
    assert 1.4 < time.monotonic() - started < 3
    assert lines == [{"progress": {"bytes": 100, "total": 300, "objects": 0, "of": 3}}]
    assert ticks == [1]
    run.ended(OSError("gone"))
    assert not run.room(1)  # nothing more once one failed
    assert isinstance(run.wait([]), OSError)
