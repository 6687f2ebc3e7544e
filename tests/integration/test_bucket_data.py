"""`bucket-data` as the nodes run it: the node runtime's zipapp under python3, against moto's S3
over HTTP. Fetches of a prefix and of one object with their checksums, the cache across
fetches (unchanged, changed, removed, a file changed on the node), a fetch stopped half way
resumed with what was whole, symlinks and bad keys refused, the disk checked first, uploads."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from orchestrator.node import runtime

BUCKET = "orch-data"
Run = Callable[..., tuple[int, list[dict]]]


@pytest.fixture
def s3(moto_endpoint: str):  # noqa: ANN201
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def run(moto_endpoint: str, tmp_path: Path) -> Run:
    """Run `bucket-data COMMAND` from the built zipapp with a request; (exit code, lines)."""
    zipapp = tmp_path / runtime.file_name()
    zipapp.write_bytes(runtime.build())

    def call(command: str, python: str = sys.executable, **request: object) -> tuple[int, list]:
        request = {
            "endpoint_url": moto_endpoint,
            "region": "us-east-1",
            "credentials": {"access_key_id": "testing", "secret_access_key": "testing"},
            **request,
        }
        done = subprocess.run(
            [python, "-u", str(zipapp), "bucket-data", command], input=json.dumps(request),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert done.stderr == "", done.stderr
        return done.returncode, lines

    return call


def put(s3, objects: dict[str, bytes]) -> None:  # noqa: ANN001
    for key, body in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)


def digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def expected(objects: dict[str, bytes], prefix: str) -> dict[str, str]:
    return {
        k.removeprefix(prefix): hashlib.sha256(v).hexdigest()
        for k, v in objects.items()
        if not k.endswith("/")
    }


def test_a_prefix_arrives_whole_then_only_what_changed_is_fetched(
    s3, run: Run, tmp_path: Path
) -> None:  # noqa: ANN001
    objects = {f"ds/part-{i}/shard-{i}.bin": os.urandom(3000 + i) for i in range(12)}
    objects["ds/big.bin"] = os.urandom(17 * 1024 * 1024)  # in parts, at once
    objects["ds/folder/"] = b""  # a console's folder marker: no file
    put(s3, objects)
    dst = tmp_path / "node" / "data"

    code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst))
    assert code == 0, lines
    total = sum(len(v) for v in objects.values())
    assert lines[0] == {"listing": {"objects": 13, "bytes": total}}
    assert lines[1] == {"plan": {"fetch": 13, "fetch_bytes": total, "keep": 0, "remove": 0}}
    assert {k: v for k, v in lines[-1]["done"].items() if k != "seconds"} == {
        "objects": 13, "fetched": 13, "bytes": total, "kept": 0, "removed": 0,
    }  # fmt: skip
    assert digests(dst) == expected(objects, "ds/")
    manifest = json.loads((dst.parent / ".data.orch-data.json").read_text())
    assert manifest["url"] == f"s3://{BUCKET}/ds" and manifest["complete"] is True
    assert run("status", url=f"s3://{BUCKET}/ds", dst=str(dst))[1] == [
        {"status": {"complete": True, "objects": 13, "bytes": total}}
    ]

    code, lines = run("fetch", url=f"s3://{BUCKET}/ds/", dst=str(dst))  # unchanged
    assert code == 0 and lines[1]["plan"] == {"fetch": 0, "fetch_bytes": 0, "keep": 13,
                                              "remove": 0}  # fmt: skip

    objects["ds/part-1/shard-1.bin"] = b"changed"
    objects["ds/new/one.bin"] = b"new"
    del objects["ds/part-2/shard-2.bin"]
    put(s3, {k: objects[k] for k in ("ds/part-1/shard-1.bin", "ds/new/one.bin")})
    s3.delete_object(Bucket=BUCKET, Key="ds/part-2/shard-2.bin")
    (dst / "part-3" / "shard-3.bin").write_bytes(b"the job wrote over it")
    (dst / "mine.txt").write_text("not the bucket's")  # no manifest lists it: never touched
    code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst))
    assert code == 0, lines
    assert lines[1]["plan"]["fetch"] == 3 and lines[1]["plan"]["remove"] == 1
    assert lines[-1]["done"]["fetched"] == 3 and lines[-1]["done"]["kept"] == 10
    assert digests(dst) == {**expected(objects, "ds/"), "mine.txt": digests(dst)["mine.txt"]}
    assert (dst / "mine.txt").read_text() == "not the bucket's"

    (dst / "new" / "one.bin").write_bytes(b"new!")  # a changed size: no longer the fetch's
    assert run("status", url=f"s3://{BUCKET}/ds", dst=str(dst))[1][0]["status"]["complete"] is False
    assert (
        run("status", url=f"s3://{BUCKET}/other", dst=str(dst))[1][0]["status"]["complete"] is False
    )


def test_one_object_is_fetched_to_the_file_named_and_kept_next_time(
    s3, run: Run, tmp_path: Path
) -> None:  # noqa: ANN001
    body = os.urandom(50_000)
    put(s3, {"models/tokenizer.json": body})
    dst = tmp_path / "tok.json"
    for fetched in (1, 0):
        code, lines = run("fetch", url=f"s3://{BUCKET}/models/tokenizer.json", dst=str(dst))
        assert code == 0, lines
        assert lines[-1]["done"]["fetched"] == fetched
    assert dst.read_bytes() == body
    assert run("status", url=f"s3://{BUCKET}/models/tokenizer.json", dst=str(dst))[1] == [
        {"status": {"complete": True, "objects": 1, "bytes": 50_000}}
    ]


def test_a_stopped_fetch_resumes_with_what_was_whole_and_is_never_taken_for_complete(
    s3, run: Run, tmp_path: Path
) -> None:  # noqa: ANN001
    objects = {f"ds/a/{i:03d}": os.urandom(2000) for i in range(40)}
    objects["ds/z/last"] = b"last"
    put(s3, objects)
    dst = tmp_path / "data"
    (dst / "z").parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (dst / "z").symlink_to(outside)  # job code put a symlink where a folder goes

    code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst), concurrency=2)
    assert code == 1 and lines[-1]["kind"] == "key" and "'z'" in lines[-1]["error"]
    assert list(outside.iterdir()) == []
    manifest = json.loads((tmp_path / ".data.orch-data.json").read_text())
    assert manifest["complete"] is False
    whole = expected(objects, "ds/")
    # at most 4 x concurrency were in flight when the fetch stopped: the rest are whole
    assert len(manifest["files"]) >= 40 - 8
    assert all(digests(dst)[rel] == whole[rel] for rel in manifest["files"])
    assert not [p for p in dst.rglob("*") if "orch-part" in p.name]
    assert run("status", url=f"s3://{BUCKET}/ds", dst=str(dst))[1][0]["status"]["complete"] is False

    (dst / "z").unlink()
    (dst / "z").mkdir()
    (dst / "z" / ".last.orch-part-0123456789ab").write_bytes(b"la")  # a killed fetch's part
    (dst / "z" / ".last.orch-part-notes").write_text("the job's")
    code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst))
    assert code == 0, lines
    assert sorted(p.name for p in (dst / "z").iterdir()) == [".last.orch-part-notes", "last"]
    assert lines[-1]["done"]["kept"] == len(manifest["files"])
    assert lines[-1]["done"]["fetched"] == 41 - len(manifest["files"])
    assert digests(dst) == {
        **whole,
        "z/.last.orch-part-notes": digests(dst)["z/.last.orch-part-notes"],
    }


def test_a_manifest_rewritten_by_job_code_removes_nothing_outside(
    s3, run: Run, tmp_path: Path
) -> None:  # noqa: ANN001
    put(s3, {"ds/a": b"a"})
    dst = tmp_path / "data"
    assert run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst))[0] == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me")
    (dst / "lnk").symlink_to(outside)
    manifest_path = tmp_path / ".data.orch-data.json"
    manifest = json.loads(manifest_path.read_text())
    listed = {"etag": '"x"', "size": 7, "local_size": 7, "mtime_ns": 1}
    for rel in ("lnk/victim", "../outside/victim", str(outside / "victim")):
        manifest["files"][rel] = listed
    manifest_path.write_text(json.dumps(manifest))

    code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst))
    assert code == 0 and lines[1]["plan"]["remove"] == 1, lines  # lnk/victim, not reached
    assert (outside / "victim").read_text() == "keep me"


def test_bad_sources_and_keys_say_what_and_write_nothing(s3, run: Run, tmp_path: Path) -> None:  # noqa: ANN001
    dst = tmp_path / "data"
    code, lines = run("fetch", url="s3://no-such-bucket-here/ds", dst=str(dst))
    assert (code, lines[-1]["kind"]) == (1, "missing")
    assert "s3://no-such-bucket-here/ds" in lines[-1]["error"]
    code, lines = run("fetch", url=f"s3://{BUCKET}/nothing", dst=str(dst))
    assert (code, lines[-1]["kind"]) == (1, "missing") and "nothing" in lines[-1]["error"]

    put(s3, {"ds/ok": b"1", "ds/a//b": b"2"})
    code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(dst))
    assert (code, lines[-1]["kind"]) == (1, "key") and "a//b" in lines[-1]["error"]
    assert not dst.exists()


def test_the_disk_is_checked_before_anything_is_downloaded(s3, run: Run, tmp_path: Path) -> None:  # noqa: ANN001
    put(s3, {"ds/big": os.urandom(3 * 1024 * 1024)})
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        code, lines = run("fetch", url=f"s3://{BUCKET}/ds", dst=str(small / "data"))
        assert (code, lines[-1]["kind"]) == (1, "disk")
        assert "3145728 bytes to download" in lines[-1]["error"]
        assert f"free on the disk of {small / 'data'}" in lines[-1]["error"]
        assert not list((small / "data").iterdir())
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_without_boto3_the_node_is_told_what_to_install(s3, run: Run, tmp_path: Path) -> None:  # noqa: ANN001
    code, lines = run(
        "fetch", python="/usr/bin/python3", url=f"s3://{BUCKET}/ds", dst=str(tmp_path / "d")
    )
    assert (code, lines[-1]["kind"]) == (1, "boto3") and "pip install boto3" in lines[-1]["error"]


def test_upload_sends_every_regular_file_and_follows_no_symlink(
    s3, run: Run, tmp_path: Path
) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "model.bin").write_bytes(os.urandom(9 * 1024 * 1024))
    (out / "logs" / "train.log").write_text("loss 1.0\n")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("not for the bucket")
    (out / "link").symlink_to(secret / "key")
    (out / "linked-dir").symlink_to(secret)

    code, lines = run("upload", src=str(out), url=f"s3://{BUCKET}/runs/7")
    assert code == 0, lines
    done = lines[-1]["done"]
    assert (done["files"], done["bytes"], done["skipped"]) == (2, 9 * 1024 * 1024 + 9, 2)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert keys == {"runs/7/model.bin", "runs/7/logs/train.log"}
    body = s3.get_object(Bucket=BUCKET, Key="runs/7/model.bin")["Body"].read()
    assert body == (out / "model.bin").read_bytes()

    code, lines = run("upload", src=str(tmp_path / "never"), url=f"s3://{BUCKET}/runs/8")
    assert code == 0 and lines == [
        {"done": {"files": 0, "bytes": 0, "skipped": 0, "seconds": 0.0, "missing": True}}
    ]
