"""Bucket to node: the node runtime's `bucket-data fetch` against boto3's transfer manager
downloading the same prefix, in the same run, on moto's S3 over HTTP.

- a prefix of 64 MB objects (2048 MB by default): throughput, target at least 0.9x the
  baseline's;
- 10,000 objects of 100 KB: time, target at most 1.2x the baseline's;
- the same 10,000 objects fetched again with the bucket unchanged (what a kept cluster's next
  job does): time against the first fetch, target at most 0.1x.

The baseline is a script of a dozen lines: ListObjectsV2, then one s3transfer
`TransferManager.download(bucket, key, filename)` per object, all submitted at once, with the
same concurrency (16) and part size (8 MB). Both run as processes of their own (the fetch from
the built zipapp, as on a node), alternating in order, each into an empty folder that is then
removed; moto's server runs in a process of its own on 127.0.0.1, and the large objects are
read once before any timing (moto keeps them in temporary files). Everything shares this
machine's cores and disk, so the ratios, not the absolute figures, are the result.

    .venv/bin/python -m bench.bucket_data [--large-mb 2048] [--small 10000] [--repeats 3]
        [--small-repeats N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report_targets  # noqa: E402
from orchestrator.node import runtime  # noqa: E402

MB = 1024 * 1024
BUCKET = "bench-data"
CONCURRENCY = 16
CREDENTIALS = {"access_key_id": "bench", "secret_access_key": "bench"}

BASELINE = r"""
import os, sys, time
import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
endpoint, bucket, prefix, dst, concurrency = sys.argv[1:6]
concurrency = int(concurrency)
client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="bench", aws_secret_access_key="bench",
                      config=Config(max_pool_connections=concurrency + 4))
pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
keys = [item["Key"] for page in pages for item in page.get("Contents", ())]
config = TransferConfig(max_concurrency=concurrency, multipart_chunksize=8 * 1024 * 1024)
with create_transfer_manager(client, config) as manager:
    for key in keys:
        path = os.path.join(dst, key[len(prefix) + 1:])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        manager.download(bucket, key, path)
"""


def start_moto(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("moto_server did not start")


def fill(endpoint: str, prefix: str, count: int, size: int) -> None:
    import os

    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench")  # fmt: skip
    body = os.urandom(size)

    def put(i: int) -> None:
        # a distinct first block per object: no two objects are one
        data = i.to_bytes(8, "big") + body[8:]
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/d{i % 100:02d}/obj-{i:05d}", Body=data)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, range(count)))


def ours(zipapp: Path, endpoint: str, prefix: str, dst: Path) -> float:
    request = {"url": f"s3://{BUCKET}/{prefix}", "dst": str(dst), "endpoint_url": endpoint,
               "region": "us-east-1", "credentials": CREDENTIALS,
               "concurrency": CONCURRENCY}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-u", str(zipapp), "bucket-data", "fetch"], input=json.dumps(request),
        capture_output=True, text=True,
    )  # fmt: skip
    spent = time.monotonic() - started
    last = json.loads(done.stdout.splitlines()[-1])
    if done.returncode != 0 or "done" not in last:
        raise SystemExit(f"bucket-data fetch failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    return spent


def baseline(endpoint: str, prefix: str, dst: Path) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", BASELINE, endpoint, BUCKET, prefix, str(dst), str(CONCURRENCY)],
        check=True,
    )  # fmt: skip
    return time.monotonic() - started


def compare(zipapp: Path, endpoint: str, prefix: str, work: Path, repeats: int) -> dict:
    """Medians of (first fetch, fetch again unchanged, baseline) seconds."""
    times: dict[str, list[float]] = {"first": [], "again": [], "base": []}
    for rep in range(repeats):
        for name in ("ours", "base") if rep % 2 == 0 else ("base", "ours"):
            dst = work / f"{name}-{rep}" / "data"
            dst.parent.mkdir(parents=True)
            if name == "ours":
                times["first"].append(ours(zipapp, endpoint, prefix, dst))
                times["again"].append(ours(zipapp, endpoint, prefix, dst))
            else:
                times["base"].append(baseline(endpoint, prefix, dst))
            shutil.rmtree(dst.parent)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mb", type=int, default=2048)
    parser.add_argument("--small", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small-repeats", type=int, default=None)  # default: --repeats
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = start_moto(port)
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench",
                     ).create_bucket(Bucket=BUCKET)  # fmt: skip
        fill(endpoint, "large", max(1, args.large_mb // 64), 64 * MB)
        fill(endpoint, "small", args.small, 100 * 1024)
        with tempfile.TemporaryDirectory(prefix="orch-bench-bucket-") as tmp:
            work = Path(tmp)
            zipapp = work / runtime.file_name()
            zipapp.write_bytes(runtime.build())
            # moto keeps large objects in temporary files: read them once before timing, so
            # neither side is the first to meet a cold page cache
            baseline(endpoint, "large", work / "warm")
            shutil.rmtree(work / "warm")
            large = compare(zipapp, endpoint, "large", work, args.repeats)
            small = compare(zipapp, endpoint, "small", work, args.small_repeats or args.repeats)
    finally:
        server.kill()
        server.wait()
    size = max(1, args.large_mb // 64) * 64
    rows = [
        (f"fetch of {size} MB in 64 MB objects", size / large["first"], "MB/s",
         size / large["base"], "boto3 transfer manager, same prefix", "ratio >= 0.9"),
        (f"fetch of {args.small} objects of 100 KB", small["first"], "s", small["base"],
         "boto3 transfer manager, same prefix", "ratio <= 1.2"),
        (f"fetch again, bucket unchanged ({args.small} objects)", small["again"], "s",
         small["first"], "the first fetch of the same prefix", "ratio <= 0.1"),
    ]  # fmt: skip
    return 0 if report_targets("bucket to node", rows) else 1


if __name__ == "__main__":
    sys.exit(main())
