"""Data at scale on real namespace nodes: datasets from a bucket (moto's S3 over HTTP, on this
machine's address on the nodes' bridge), local data over the uplink once, outputs back to a
bucket. Shown here:

- a 3-node kept cluster's first job reads a bucket prefix, a single object and a local
  directory on every node (the job checks every file's SHA-256 against the test's list and
  fails otherwise), and the bytes this machine sent to the nodes over SSH (an iptables counter
  on the bridge, S3's replies left out) are at most 1.1x the local dataset plus a fixed
  allowance for the job's own traffic; each node's outputs reach the bucket when the job ends;
- its second job with the bucket unchanged downloads nothing; after one object changed, one
  came and one went, the third downloads only the two new ones on each node and removes the
  gone one;
- on a 2-node job whose node 1 is lost, the replacement takes the bucket data from node 0 and
  the local data over the cluster's network, the job resumes from its checkpoint, and a cancel
  uploads the outputs;
- a bucket key that would land outside its destination fails the job before it runs, with a
  message naming the source and the node, nothing left running.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path

import boto3
import pytest

from tests.support.bucket_server import s3_on_bridge
from tests.support.helpers import (
    assert_nothing_left,
    detach,
    events,
    fast_env,
    job_json,
    preempt,
    run_orch,
    wait_for,
    wait_for_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# A bridge and subnet of these jobs' own: the S3 server listens on the bridge's address from
# before the first node (see tests/e2e/test_container_job.py for the same arrangement).
BRIDGE = "orchdata0"
SUBNET = IPv4Network("10.213.78.0/24")
BUCKET = "datasets"
LOST_BUCKET = "datasets-lost"
EVIL_BUCKET = "datasets-evil"
LOCAL_MB = 48  # the local dataset: large next to the job's own SSH traffic
ALLOWANCE = 3 * 2**20  # that traffic: runtime, configs, workdir, logs, for 3 nodes

# Checks every data file against `expected.json` (SHA-256 by relative path), writes what it
# found to ~/out, then (with an argument) counts steps into its checkpoint until cancelled.
CHECK = """\
import hashlib, json, os, pathlib, sys, time
home = pathlib.Path.home()
def digests(root):
    root = home / root
    if root.is_file():
        return hashlib.sha256(root.read_bytes()).hexdigest()
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}
expected = json.loads(pathlib.Path("expected.json").read_text())
found = {name: digests(name) for name in expected}
out = home / "out"
out.mkdir(exist_ok=True)
(out / f"check-{os.environ['ORCH_JOB_ID']}.json").write_text(json.dumps(found == expected))
if found != expected:
    print("data differs:", {k for k in expected if found.get(k) != expected[k]}, flush=True)
    sys.exit(3)
state = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"]) / "state.json"
step = json.loads(state.read_text())["step"] if state.exists() else 0
print(f"resumed at {step}" if step else "fresh", flush=True)
while True:
    step += 1
    print(json.dumps({"step": step, "loss": 0.5}), flush=True)
    if len(sys.argv) < 2:
        break
    state.parent.mkdir(parents=True, exist_ok=True)
    (state.parent / "state.tmp").write_text(json.dumps({"step": step}))
    (state.parent / "state.tmp").rename(state)
    time.sleep(1)
"""


@dataclass(frozen=True)
class Bucket:
    endpoint: str
    port: int

    def client(self):  # noqa: ANN201
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


@pytest.fixture(scope="module")
def bucket() -> Iterator[Bucket]:
    """moto's S3 on the bridge's address, with the fake credentials this process's boto3 uses."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    try:
        with s3_on_bridge(BRIDGE, SUBNET) as (endpoint, port):
            yield Bucket(endpoint, port)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def uplink(bucket: Bucket) -> Iterator[Path]:
    """An iptables rule counting what this machine sends to the nodes over their bridge, S3's
    replies left out; read with `counted`. Removed afterwards."""
    rule = ["OUTPUT", "-o", BRIDGE, "-p", "tcp", "!", "--sport", str(bucket.port),
            "-m", "comment", "--comment", "orch-test-uplink"]  # fmt: skip
    subprocess.run(["iptables", "-w", "-I", *rule], check=True)
    try:
        yield Path("/dev/null")
    finally:
        subprocess.run(["iptables", "-w", "-D", *rule], check=True)


def counted() -> int:
    """Bytes the uplink rule counted so far."""
    listing = subprocess.run(
        ["iptables", "-w", "-L", "OUTPUT", "-v", "-x", "-n"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    (line,) = [row for row in listing.splitlines() if "orch-test-uplink" in row]
    return int(line.split()[1])


def env_for(home: Path, bucket: Bucket) -> dict[str, str]:
    return fast_env(
        home,
        ORCH_LOCAL_BRIDGE=BRIDGE,
        ORCH_LOCAL_SUBNET=str(SUBNET),
        ORCH_STORE_ENDPOINT_URL=bucket.endpoint,
        ORCH_STORE_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )


def put_objects(client, objects: dict[str, bytes], bucket: str = BUCKET) -> None:  # noqa: ANN001
    client.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_job(
    tmp_path: Path,
    name: str,
    *,
    nodes: int,
    expected: dict,
    run: str,
    spot: bool = False,
    bucket: str = BUCKET,
) -> Path:
    """The job's workdir (the check script, the expected digests) and its spec."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "check.py").write_text(CHECK)
    (work / "expected.json").write_text(json.dumps(expected))
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nworkdir: work\nlauncher: none\n"
        f"resources: {{nodes: {nodes}, gpus_per_node: 1, spot: {str(spot).lower()}}}\n"
        "data:\n"
        f"  - {{src: 's3://{bucket}/ds', dst: ~/ds}}\n"
        f"  - {{src: 's3://{bucket}/one/model.bin', dst: ~/model.bin}}\n"
        "  - {src: ./local, dst: ~/local}\n"
        f"outputs: [{{src: ~/out, dst: 's3://{bucket}/results/{name}', nodes: all}}]\n"
        "checkpoint: {dir: ~/ckpt, pull_every: 1}\n"
        f"run: {run}\n"
    )
    return path


def local_dataset(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "local"
    (folder / "shards").mkdir(parents=True)
    found = {}
    for i in range(LOCAL_MB // 8):
        data = os.urandom(8 * 2**20)
        (folder / "shards" / f"{i:02d}.bin").write_bytes(data)
        found[f"shards/{i:02d}.bin"] = sha(data)
    return found


def data_events(job: dict) -> list[str]:
    return [e["message"] for e in events(job, "DATA")]


def test_a_kept_cluster_reads_a_bucket_once_and_only_what_changed(
    tmp_path: Path, bucket: Bucket, uplink: Path
) -> None:
    s3 = bucket.client()
    ds = {f"ds/part-{i:03d}.bin": os.urandom(50_000 + i) for i in range(40)}
    ds["ds/nested/deep/labels.json"] = b'{"labels": [1, 2, 3]}'
    model = os.urandom(3 * 2**20 + 17)  # a multipart download
    put_objects(s3, {**ds, "one/model.bin": model})
    expected = {
        "ds": {key[3:]: sha(body) for key, body in ds.items()},
        "model.bin": sha(model),
        "local": local_dataset(tmp_path),
    }
    home = tmp_path / "orch"
    env = env_for(home, bucket)
    spec = write_job(tmp_path, "bucket-kept", nodes=3, expected=expected, run="python check.py")

    before = counted()
    first = run_orch(["submit", str(spec), "--cluster", "data3"], env, timeout=600)
    sent = counted() - before
    assert first.returncode == 0, first.stdout + first.stderr
    job1 = job_json(_last_job(env), env)
    local_bytes = LOCAL_MB * 2**20
    assert sent <= 1.1 * local_bytes + ALLOWANCE, (sent, data_events(job1))
    fetched = [m for m in data_events(job1) if m.startswith("data[0]")]
    assert fetched and "41 object(s) on 3 node(s): downloaded 123 " in fetched[-1], fetched
    # Every node's check went to the bucket when the job ended.
    results = s3.list_objects_v2(Bucket=BUCKET, Prefix="results/bucket-kept/")["Contents"]
    checks = sorted(o["Key"] for o in results if "check-" in o["Key"])
    assert checks == [f"results/bucket-kept/node-{r}/check-{job1['id']}.json" for r in range(3)]
    body = s3.get_object(Bucket=BUCKET, Key=checks[0])["Body"].read()
    assert json.loads(body) is True
    shown = run_orch(["status", job1["id"]], env)
    assert "outputs" in shown.stdout and "uploaded" in shown.stdout, shown.stdout

    # The bucket unchanged: the second job downloads nothing.
    second = run_orch(["submit", str(spec), "--cluster", "data3"], env, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    job2 = job_json(_last_job(env), env)
    fetched = [m for m in data_events(job2) if m.startswith("data[0]")]
    assert fetched and "downloaded 0 (0 B), kept 123" in fetched[-1], data_events(job2)

    # One object changed, one new, one gone: only the two move, the gone one leaves each node.
    changed = os.urandom(60_000)
    added = os.urandom(70_000)
    s3.put_object(Bucket=BUCKET, Key="ds/part-000.bin", Body=changed)
    s3.put_object(Bucket=BUCKET, Key="ds/part-new.bin", Body=added)
    s3.delete_object(Bucket=BUCKET, Key="ds/part-039.bin")
    expected["ds"].update({"part-000.bin": sha(changed), "part-new.bin": sha(added)})
    del expected["ds"]["part-039.bin"]
    (tmp_path / "work" / "expected.json").write_text(json.dumps(expected))
    third = run_orch(["submit", str(spec), "--cluster", "data3"], env, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    job3 = job_json(_last_job(env), env)
    fetched = [m for m in data_events(job3) if m.startswith("data[0]")]
    assert fetched and "downloaded 6 " in fetched[-1], data_events(job3)
    assert "removed 3 gone from the bucket" in fetched[-1], fetched
    down = run_orch(["down", "data3"], env, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr


def _last_job(env: dict[str, str]) -> str:
    listed = run_orch(["status", "--json"], env)
    return json.loads(listed.stdout)["jobs"][0]["id"]


def test_a_replacement_takes_the_data_from_a_survivor_and_a_cancel_uploads_outputs(
    tmp_path: Path, bucket: Bucket
) -> None:
    s3 = bucket.client()
    ds = {f"ds/part-{i:02d}.bin": os.urandom(40_000) for i in range(12)}
    model = os.urandom(100_000)
    put_objects(s3, {**ds, "one/model.bin": model}, LOST_BUCKET)
    expected = {
        "ds": {key[3:]: sha(body) for key, body in ds.items()},
        "model.bin": sha(model),
        "local": _small_local(tmp_path),
    }
    home = tmp_path / "orch"
    env = env_for(home, bucket)
    spec = write_job(tmp_path, "bucket-lost", nodes=2, expected=expected,
                     run="python check.py forever", spot=True, bucket=LOST_BUCKET)  # fmt: skip
    job_id = detach(spec, env)
    wait_for(job_id, env, lambda j: j["state"] == "RUNNING" and (j["step"] or 0) >= 4,
             "a few steps")  # fmt: skip
    preempt(job_id, env, node=1, notice=0)
    job = wait_for(
        job_id, env,
        lambda j: j["recoveries"] == 1 and j["state"] == "RUNNING" and (j["step"] or 0) >= 8,
        "the run resumed on the replacement", timeout=300,
    )  # fmt: skip
    messages = data_events(job)
    assert any("bucket data copied from node 0 to node(s) 1" in m for m in messages), messages
    # The replacement's check passed (else the run fails), and the run went on from its step.
    resumed = re.findall(r"resumed at (\d+)", run_orch(["logs", job_id], env).stdout)
    assert resumed and int(resumed[-1]) >= 4, resumed
    cancelled = run_orch(["cancel", job_id], env, timeout=300)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    job = wait_for_state(job_id, env, "CANCELLED")
    uploads = [e["message"] for e in events(job, "OUTPUTS")]
    assert any("(job cancelled)" in m and "uploaded" in m for m in uploads), uploads
    check = f"results/bucket-lost/node-1/check-{job_id}.json"
    assert json.loads(s3.get_object(Bucket=LOST_BUCKET, Key=check)["Body"].read()) is True
    assert_nothing_left(job)


def _small_local(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "local"
    folder.mkdir()
    data = os.urandom(200_000)
    (folder / "a.bin").write_bytes(data)
    return {"a.bin": sha(data)}


def test_a_bucket_key_that_escapes_its_destination_fails_the_job_with_nothing_left(
    tmp_path: Path, bucket: Bucket
) -> None:
    """The submit's check passes (the prefix exists); the node refuses the key, and the job
    fails with a message naming the source, its node ended."""
    s3 = bucket.client()
    put_objects(s3, {"ds/fine.bin": b"x", "ds/../outside.txt": b"planted"}, EVIL_BUCKET)
    (tmp_path / "work").mkdir()
    spec = tmp_path / "evil.yaml"
    spec.write_text(
        "name: evil\nworkdir: work\nlauncher: none\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"data: [{{src: 's3://{EVIL_BUCKET}/ds', dst: ~/ds}}]\nrun: echo never\n"
    )
    env = env_for(tmp_path / "orch", bucket)
    done = run_orch(["submit", str(spec)], env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    job = job_json(_last_job(env), env)
    assert job["state"] == "FAILED"
    assert job["reason"].startswith(f"data[0] s3://{EVIL_BUCKET}/ds -> ~/ds: "), job["reason"]
    assert "outside.txt" in job["reason"] and "on node 0" in job["reason"], job["reason"]
    assert not [e for e in job["events"] if e["kind"] == "RUNNING"]
    assert_nothing_left(job)
