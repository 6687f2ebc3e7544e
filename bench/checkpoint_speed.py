"""Checkpoints at real sizes on local nodes, each figure against a baseline of the same run.

- save -> copy in the mirror: a script rewrites a 100 MB file in place; from the end of each
  save to its copy being in the mirror (the job's agent stages it, the keeper fetches it);
  baseline: one raw rsync of such a file from the node.
- pull of a 2 GB checkpoint (`step-N/` with a 2 GB file) into an empty mirror, against a raw
  `rsync -a` of the same file from the node (the same ssh options: key, cipher).
- resume: the newest checkpoint put back on new nodes, from the store (file://: every node
  copies for itself, in parallel) and from the mirror (pushed by rsync), against one raw rsync
  of the file to one node.
- upload to the store from a node (moto's S3 on 127.0.0.1): the agent's own upload against a
  plain boto3 `upload_file` of the same file from the same node.
- the step rate of a CPU-bound training loop that saves 100 MB every few seconds, with its
  checkpoints staged, pulled and uploaded, against the same loop saving where orch does not
  look.

Nodes are loopback local nodes (sshd on 127.0.0.1), so they reach the moto server too. All of
them share this machine's cores and disk: a push to two nodes does twice the work of a push
to one, here, and writes twice the bytes to the one disk. The resume from the store to 2 nodes
is therefore also shown against one raw rsync to each of 2 nodes at once (the same bytes): on
a cloud each node has its own disk and link, and that row is the cost orch adds.

    .venv/bin/python -m bench.checkpoint_speed [--size-mb 2048] [--repeats 3] [--saves 8]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report_targets  # noqa: E402
from orchestrator.cluster.checkpoints.collector import CheckpointCollector  # noqa: E402
from orchestrator.cluster.checkpoints.keeper import KeeperOptions  # noqa: E402
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror  # noqa: E402
from orchestrator.node.checkpoint_files import new_digest  # noqa: E402
from orchestrator.node.checkpoint_protocol import AgentLayout  # noqa: E402
from orchestrator.remote.sync import ssh_transport_argv  # noqa: E402
from orchestrator.spec.model import CheckpointSpec  # noqa: E402
from tests.support.checkpoint_nodes import KeeperNodes, end_run, keeper_nodes  # noqa: E402

MB = 1024 * 1024
# The store resume to 2 nodes against a baseline that writes as many bytes: here both nodes'
# disks are this machine's one disk, which bounds any 2-node resume (see the module docstring).
SAME_BYTES = "resume from the store to 2 nodes, same bytes"

WRITER = r"""
import hashlib, os, sys, time
path, log = sys.argv[1], sys.argv[2]
size, saves, pause = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
for n in range(saves):
    body = os.urandom(size)
    with open(path, "r+b" if os.path.exists(path) else "wb") as handle:  # in place
        handle.truncate(0)
        for start in range(0, size, 4 << 20):
            handle.write(body[start : start + (4 << 20)])
    finished = time.time()
    with open(log, "a") as out:
        out.write(f"{hashlib.blake2b(body, digest_size=32).hexdigest()} {finished}\n")
    time.sleep(pause)
"""

LOOP = r"""
import os, sys, time
out, size, every, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
state = os.urandom(size)
steps, started, saved = 0, time.monotonic(), time.monotonic()
x = 0
while time.monotonic() - started < seconds:
    for i in range(20000):  # one "step" of compute, on one core
        x = (x * 1103515245 + i) % 2147483648
    steps += 1
    if time.monotonic() - saved >= every:
        with open(out, "r+b" if os.path.exists(out) else "wb") as handle:
            handle.truncate(0)
            handle.write(state)
        saved = time.monotonic()
print(steps / (time.monotonic() - started))
"""

UPLOAD_AGENT = r"""
import json, sys, time
sys.path.insert(0, ".")
import checkpoint_stores
settings, path, key = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
store = checkpoint_stores.open_store(settings)
started = time.perf_counter()
store.upload(path, key)
print(time.perf_counter() - started)
"""

UPLOAD_PLAIN = r"""
import json, sys, time
import boto3
settings, path, key = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
bucket = settings["url"][5:].split("/")[0]
creds = settings["credentials"]
client = boto3.client("s3", endpoint_url=settings["endpoint_url"], region_name="us-east-1",
                      aws_access_key_id=creds["access_key_id"],
                      aws_secret_access_key=creds["secret_access_key"])
started = time.perf_counter()
client.upload_file(path, bucket, key)
print(time.perf_counter() - started)
"""


def hash_rate() -> float:
    """MB/s of the checkpoint digest (BLAKE2b-256) here, on 256 MB."""
    data = bytes(256 * MB)
    started = time.perf_counter()
    new_digest().update(data)
    return 256 / (time.perf_counter() - started)


def median(values: list[float]) -> float:
    return statistics.median(values)


def raw_rsync(nodes: KeeperNodes, rank: int, source: str, destination: str, *, push: bool) -> float:
    """One rsync -a over the same ssh options orch uses (not multiplexed), timed."""
    address = nodes.cluster.addresses[rank]
    transport = shlex.join(ssh_transport_argv(address, nodes.cluster.identity, 10, multiplex=False))
    remote = f"{address.user}@{address.host}:"
    argv = ["rsync", "-a", "-e", transport]
    argv += [source, remote + destination] if push else [remote + source, destination]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def wait(what: str, done: Callable[[], bool], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def staged_and_stored(nodes: KeeperNodes, path: str, *, stored: bool) -> bool:
    for report in nodes.keeper.collector.read().values():
        node_file = report.manifest.files.get(path) if report.manifest else None
        if node_file is not None and node_file.settled:
            return not stored or bool(node_file.staged and node_file.staged.stored)
    return False


# --- the figures --------------------------------------------------------------------------


def save_latency(home: Path, size: int, saves: int) -> tuple[float, float, list[float]]:
    """(median save -> mirror seconds, median raw rsync seconds of such a file, all latencies)."""
    options = KeeperOptions(pull_every=3600)  # only the agents' news triggers a pull
    with keeper_nodes(home, "latency", options=options) as nodes:
        nodes.keeper.watch(nodes.cluster, gone=set, on_failure=lambda reason: None)
        nodes.cluster.head.run("cat > writer.py", stdin=WRITER)
        nodes.run(0, f"setsid nohup python3 writer.py ckpt/snapshot.pt saves.log {size} {saves} "
                     "6 > writer.out 2>&1 < /dev/null &")  # fmt: skip
        latencies: list[float] = []
        for n in range(saves):
            wait(
                "a save",
                lambda n=n: (
                    len(nodes.run(0, "cat saves.log 2>/dev/null; true").split()) >= 2 * (n + 1)
                ),
            )
            digest, finished = nodes.run(0, "cat saves.log").split()[2 * n : 2 * n + 2]

            def mirrored(digest: str = digest) -> bool:
                return any(
                    r.name == "snapshot.pt" and r.files_json and digest in r.files_json
                    for r in nodes.ledger.checkpoints("latency")
                )

            wait("the save in the mirror", mirrored, timeout=120)
            record = next(r for r in nodes.ledger.checkpoints("latency")
                          if r.files_json and digest in r.files_json)  # fmt: skip
            latencies.append(record.pulled_at.timestamp() - float(finished))
        nodes.keeper.stop_watching()
        baseline = [raw_rsync(nodes, 0, "ckpt/snapshot.pt", str(home / f"raw{i}.pt"), push=False)
                    for i in range(3)]  # fmt: skip
    return median(latencies), median(baseline), latencies


def pull_and_resume(home: Path, size_mb: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Pull of a `size_mb` checkpoint, and the resumes, each (orch, baseline) median seconds."""
    store = home / "store"
    store.mkdir(parents=True)
    spec = CheckpointSpec(dir="~/ckpt", store=f"file://{store}", mirror="all")
    figures: dict[str, tuple[float, float]] = {}
    with keeper_nodes(home, "big", checkpoint=spec) as nodes:
        nodes.run(0, f"mkdir -p ckpt/step-000001 && head -c {size_mb * MB} /dev/urandom > "
                     "ckpt/step-000001/state.pt && : > ckpt/step-000001/COMPLETE")  # fmt: skip
        wait("the checkpoint staged and uploaded",
             lambda: staged_and_stored(nodes, "step-000001/state.pt", stored=True))  # fmt: skip
        ours, raw = [], []
        for rep in range(repeats):

            def orch_pull(rep: int = rep) -> float:
                mirror = CheckpointMirror(home / f"pull{rep}" / "checkpoints")
                collector = CheckpointCollector(nodes.cluster, mirror, AgentLayout("big"))
                started = time.perf_counter()
                installed = collector.collect().installed
                spent = time.perf_counter() - started
                assert [u.name for u in installed] == ["step-000001"], installed
                shutil.rmtree(mirror.root.parent)
                return spent

            def raw_pull(rep: int = rep) -> float:
                spent = raw_rsync(
                    nodes, 0, "ckpt/step-000001/state.pt", str(home / "raw"), push=False
                )
                (home / "raw").unlink()
                return spent

            for name, run in (("orch", orch_pull), ("raw", raw_pull))[:: 1 if rep % 2 == 0 else -1]:
                subprocess.run(["sync"], check=True)
                (ours if name == "orch" else raw).append(run())
        figures["pull"] = (median(ours), median(raw))
        end_run(nodes.cluster, "big")
        nodes.keeper.finish(wait_s=60)  # the mirror and the ledger hold it, the store too

    def resume(count: int, from_store: bool) -> float:
        """New nodes, the newest checkpoint put back on them: the seconds it took."""
        checkpoint = spec if from_store else CheckpointSpec(dir="~/ckpt", mirror="all")
        with keeper_nodes(home, "big", count=count, checkpoint=checkpoint) as nodes:
            spent = _seconds_in(nodes.events("RESTORED" if from_store else "PUSHED")[-1])
            for rank in range(count):
                size = nodes.run(rank, "stat -c %s ckpt/step-000001/state.pt").strip()
                assert int(size) == size_mb * MB, size
        return spent

    mirrored = home / "jobs" / "big" / "checkpoints" / "step-000001" / "state.pt"
    contenders: dict[str, Callable[[], float]] = {
        "resume from the store to 2 nodes": lambda: resume(2, True),
        "resume push from the mirror to 1 node": lambda: resume(1, False),
        "resume push from the mirror to 2 nodes": lambda: resume(2, False),
    }
    spent: dict[str, list[float]] = {name: [] for name in [*contenders, "raw", "raw2"]}
    with keeper_nodes(home / "base", "base", count=2) as base:

        def raw_push() -> float:
            seconds = raw_rsync(base, 0, str(mirrored), "pushed/", push=True)
            base.run(0, "rm -rf pushed")
            return seconds

        def raw_push_to_both() -> float:
            """The same bytes as a resume to 2 nodes: one raw rsync to each, both at once."""
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=2) as pool:
                pushes = [pool.submit(raw_rsync, base, rank, str(mirrored), "pushed/", push=True)
                          for rank in (0, 1)]  # fmt: skip
                for push in pushes:
                    push.result()
            seconds = time.perf_counter() - started
            for rank in (0, 1):
                base.run(rank, "rm -rf pushed")
            return seconds

        every = {**contenders, "raw": raw_push, "raw2": raw_push_to_both}
        for rep in range(repeats):
            order = list(every)[rep % len(every) :] + list(every)[: rep % len(every)]
            for name in order:
                subprocess.run(["sync"], check=True)  # no run pays for another's writeback
                spent[name].append(every[name]())
    baseline = median(spent["raw"])
    for name in contenders:
        figures[name] = (median(spent[name]), baseline)
    figures[SAME_BYTES] = (median(spent["resume from the store to 2 nodes"]), median(spent["raw2"]))
    return figures


def _seconds_in(message: str) -> float:
    """The `in N.N s` of a PUSHED or RESTORED event."""
    return float(message.rsplit(" in ", 1)[1].split()[0])


def upload(home: Path, size_mb: int, repeats: int) -> tuple[float, float]:
    """(agent's upload, plain boto3 upload_file) of one file from a node to moto's S3."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench",
                     ).create_bucket(Bucket="bench")  # fmt: skip
        settings = {
            "url": "s3://bench/up",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "credentials": {"access_key_id": "bench", "secret_access_key": "bench"},
        }
        with keeper_nodes(home, "upload") as nodes:
            agent_dir = AgentLayout("upload").root
            nodes.run(0, f"head -c {size_mb * MB} /dev/urandom > up.bin")
            ours, plain = [], []
            for rep in range(repeats):
                for name in ("agent", "plain") if rep % 2 == 0 else ("plain", "agent"):
                    script = UPLOAD_AGENT if name == "agent" else UPLOAD_PLAIN
                    argv = shlex.join([json.dumps(settings), "up.bin", f"up/{name}{rep}"])
                    command = (
                        f"cd {agent_dir} && cp ~/up.bin . && python3 -c "
                        + shlex.quote(script)
                        + f" {argv}; rm -f up.bin"
                    )
                    (ours if name == "agent" else plain).append(
                        float(nodes.run(0, command).split()[-1])
                    )
        return median(ours), median(plain)
    finally:
        server.stop()


def step_rate(
    home: Path, seconds: float, size_mb: int, every_s: float, repeats: int
) -> tuple[float, float]:
    """(steps/s while checkpoints are staged, pulled and uploaded; steps/s saving elsewhere)."""
    store = home / "store"
    store.mkdir(parents=True)
    spec = CheckpointSpec(dir="~/ckpt", store=f"file://{store}", mirror="all")
    options = KeeperOptions(pull_every=3600)
    watched, unwatched = [], []
    with keeper_nodes(home, "rate", checkpoint=spec, options=options) as nodes:
        nodes.cluster.head.run("cat > loop.py", stdin=LOOP)
        nodes.keeper.watch(nodes.cluster, gone=set, on_failure=lambda reason: None)
        for rep in range(repeats):
            for target in (("ckpt/state.bin", "elsewhere/state.bin") if rep % 2 == 0
                           else ("elsewhere/state.bin", "ckpt/state.bin")):  # fmt: skip
                if rep or target.startswith("elsewhere"):  # what the last run left is done
                    wait("the agent idle", lambda: staged_and_stored(nodes, "state.bin",
                                                                     stored=True))  # fmt: skip
                nodes.run(0, "mkdir -p elsewhere")
                rate = float(nodes.run(0, f"python3 loop.py {target} {size_mb * MB} {every_s} "
                                          f"{seconds}").split()[-1])  # fmt: skip
                (watched if target.startswith("ckpt") else unwatched).append(rate)
        nodes.keeper.stop_watching()
        pulled = len(nodes.ledger.checkpoints("rate"))
    if pulled == 0:
        raise SystemExit(
            "no checkpoint was pulled while the loop ran: the figure would mean nothing"
        )
    return median(watched), median(unwatched)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--latency-mb", type=int, default=100)
    parser.add_argument("--upload-mb", type=int, default=512)
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-s", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-ckpt-") as tmp:
        root = Path(tmp)
        latency, latency_base, latencies = save_latency(
            root / "a", args.latency_mb * MB, args.saves
        )
        print(f"  save -> mirror latencies: {', '.join(f'{x:.2f}' for x in latencies)} s")
        moves = pull_and_resume(root / "b", args.size_mb, args.repeats)
        uploaded, uploaded_base = upload(root / "c", args.upload_mb, args.repeats)
        watched, unwatched = step_rate(root / "d", args.rate_s, args.latency_mb, 4.0, args.repeats)
    rows = [
        (f"save -> copy in the mirror ({args.latency_mb} MB)", latency, "s", latency_base,
         "raw rsync of the file from the node", "<= 5 s"),
        (f"pull of a {args.size_mb} MB checkpoint", moves["pull"][0], "s", moves["pull"][1],
         "raw rsync of the same file", "ratio <= 1.1"),
    ]  # fmt: skip
    for name in ("resume from the store to 2 nodes", "resume push from the mirror to 1 node",
                 "resume push from the mirror to 2 nodes"):  # fmt: skip
        target = "-" if name.endswith("2 nodes") and "mirror" in name else "ratio <= 1.2"
        rows.append((name, moves[name][0], "s", moves[name][1], "raw rsync to 1 node", target))
    rows.append((SAME_BYTES, moves[SAME_BYTES][0], "s", moves[SAME_BYTES][1],
                 "raw rsync to 2 nodes at once: the same bytes to this one disk", "-"))  # fmt: skip
    rows.append((f"upload to the store from a node ({args.upload_mb} MB)", uploaded, "s",
                 uploaded_base, "plain boto3 upload_file", "ratio <= 1.2"))  # fmt: skip
    rows.append(("step rate while checkpoints move", watched, "steps/s", unwatched,
                 "the same loop saving where orch does not look", "ratio >= 0.9"))  # fmt: skip
    print(f"  BLAKE2b-256 on this machine: {hash_rate():.0f} MB/s (nodes hash what they stage and "
          "restore)")  # fmt: skip
    return 0 if report_targets("checkpoint speed", rows) else 1


if __name__ == "__main__":
    sys.exit(main())
