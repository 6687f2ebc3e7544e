"""The data phase of a kept cluster's next job, the bucket unchanged, against its first job's.

A 3-node kept cluster (`--cluster`) on local namespace nodes runs the same job again and again:
its `data` is one bucket prefix (moto's S3 over HTTP, listening on this machine's address on
the nodes' bridge) of `--objects` objects of `--object-mb` MB. The first job downloads the whole
prefix on every node; the next ones find it in the nodes' cache (ETag and size unchanged) and
download nothing. Each job's data phase is read from orch's own records: from its SYNCING
event to its SYNCED event (the workdir's sync, small, is inside both). The first job is the
baseline, in the same run; target: the next jobs' median at most 0.1x of it. Prints each job,
then the ratio. The next jobs' phase is about a second whatever the prefix's size (SSH, the
node program's start, one listing per node), so the ratio shrinks as the data grows: the
default 2 GB is a modest dataset, and at 256 MB the same second is half the first job's phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from ipaddress import IPv4Network
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import at, median, report_targets  # noqa: E402
from tests.support.bucket_server import s3_on_bridge  # noqa: E402
from tests.support.helpers import fast_env, job_json, run_orch  # noqa: E402

BRIDGE = "orchbench1"
SUBNET = IPv4Network("10.213.79.0/24")
BUCKET = "bench-data"


def data_phase_s(job: dict) -> float:
    """Seconds from the job's SYNCING event to its SYNCED event."""
    kinds = {e["kind"]: e["at"] for e in job["events"] if e["kind"] in ("SYNCING", "SYNCED")}
    return at(kinds["SYNCED"]) - at(kinds["SYNCING"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--object-mb", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with s3_on_bridge(BRIDGE, SUBNET) as (endpoint, _port):
        return measure(options, endpoint)


def measure(options: argparse.Namespace, endpoint: str) -> int:
    """The jobs on the kept cluster, against the S3 server at `endpoint`."""
    import boto3

    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    os.environ.update(creds)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    for i in range(options.objects):
        s3.put_object(Bucket=BUCKET, Key=f"ds/{i:04d}.bin",
                      Body=os.urandom(options.object_mb * 2**20))  # fmt: skip
    first, later = 0.0, []
    with tempfile.TemporaryDirectory(prefix="orch-bench-data-") as tmp:
        root = Path(tmp)
        (root / "work").mkdir()
        (root / "work" / "probe.py").write_text("print('step 1 loss 0.5', flush=True)\n")
        spec = root / "job.yaml"
        spec.write_text(
            "name: data-kept\nworkdir: work\nlauncher: none\n"
            "resources: {nodes: 3, gpus_per_node: 1}\n"
            f"data: [{{src: 's3://{BUCKET}/ds', dst: ~/ds}}]\nrun: python probe.py\n"
        )
        env = fast_env(
            root / "home", ORCH_LOCAL_BRIDGE=BRIDGE, ORCH_LOCAL_SUBNET=str(SUBNET),
            ORCH_STORE_ENDPOINT_URL=endpoint, ORCH_STORE_REGION="us-east-1",
            AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null", **creds,
        )  # fmt: skip
        try:
            for run in range(options.repeats + 1):
                done = run_orch(["submit", str(spec), "--cluster", "bench-data"], env, timeout=1800)
                if done.returncode != 0:
                    raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
                listed = run_orch(["status", "--json"], env)
                job = job_json(json.loads(listed.stdout)["jobs"][0]["id"], env)
                seconds = data_phase_s(job)
                print(f"  job {run + 1}: data phase {seconds:.2f} s", flush=True)
                if run == 0:
                    first = seconds
                else:
                    later.append(seconds)
        finally:
            run_orch(["down", "--all"], env, timeout=600)
    size = options.objects * options.object_mb
    ok = report_targets(
        f"Data phase of a kept cluster's next job, bucket unchanged ({size} MB prefix, 3 nodes)",
        [
            (
                "next job, bucket unchanged",
                median(later),
                "s",
                first,
                "the first job",
                "ratio <= 0.1",
            )
        ],
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
