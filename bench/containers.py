"""Containers on local nodes: the start of a job whose image the nodes have, and the pull of
a 2 GB image to two nodes at once. Each against its baseline in the same run.

**Start overhead**, 2 nodes x 2 processes on a kept cluster (`--cluster`): its first job, untimed,
pulls the test image (`tests.support.containers`: Debian's packages, torch bind-mounted from
the suite's venv); then the same job runs in the image (`pull: missing`: the nodes have it) and
on the bare nodes, alternating. Both are timed from orch's own records: from the job's REUSED
event (the kept cluster's nodes, up, are the job's: nothing is launched) to the moment its last
rank started, which each rank prints (`time.time()`: the nodes share this machine's clock)
into the node logs orch keeps. Each job's events are printed too, as seconds after REUSED.
The container job's extra work lies in between: its image step on every node (IMAGE: the
image found, and checked unless the node passed that check before; in parallel with the
port, the checkpoint agents and the guards) and podman's start of the container.

**Pull**: orch's pull (`orchestrator.cluster.image_pull.pull_image`, what a job's start runs)
of the 2 GB image (`bench.container_image`) to 2 nodes at once, against one raw `podman pull`
of it to one node with the same podman settings
(`orchestrator.providers.local.containers.podman_command`), the login done beforehand. Also
measured, to tell orch's own cost from the machine's: raw pulls to the 2 nodes at once, and
orch's pull to 1 node. Before each pull the nodes' copy of the image is removed and the disk
synced; the registry's files are read once first, so every pull reads them from memory.

The registry (Debian's docker-registry, htpasswd auth) listens on the nodes' bridge address;
all traffic stays on this machine. Prints each run, then medians and ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from ipaddress import IPv4Network
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Row, at, local_nodes, median, report_targets  # noqa: E402
from bench.container_image import big_image, registry_storage  # noqa: E402
from orchestrator.cluster.connections import Cluster  # noqa: E402
from orchestrator.cluster.image_pull import pull_image  # noqa: E402
from orchestrator.config import LocalSettings, Settings  # noqa: E402
from orchestrator.node.container import PullPlan  # noqa: E402
from orchestrator.node.launch import NodeLayout, home_expr  # noqa: E402
from orchestrator.providers.local import net  # noqa: E402
from orchestrator.providers.local.provider import LocalProvider  # noqa: E402
from tests.support.containers import (  # noqa: E402
    Registry,
    offline_image,
    push_image,
    running_registry,
    torch_volume,
)
from tests.support.helpers import detach, fast_env, job_json, run_orch, wait_for_state  # noqa: E402

SUBNET = IPv4Network("10.213.0.0/24")  # the local provider's default: the nodes' bridge
BRIDGE = "orchbr0"
PROBE = (
    "import os, time\n"
    "print('rank-started', os.environ['RANK'], repr(time.time()), flush=True)\n"
    "time.sleep(1)\n"
)
RANKS = 4


# --- start overhead -----------------------------------------------------------------------------


def job_spec(name: str, registry: Registry | None, ref: str, volume: str, site: str) -> str:
    """The 2 x 2 probe job; in the image when `registry` is given, else on the bare nodes."""
    text = (
        f"name: {name}\nworkdir: work\nrun: python3 probe.py\n"
        "resources: {nodes: 2, gpus_per_node: 2}\n"
        f'env: {{PYTHONPATH: "{site}", OMP_NUM_THREADS: "1"}}\n'
    )
    if registry is None:
        return text
    return text + (
        "container:\n"
        f"  image: {ref}\n"
        "  pull: missing\n"
        f"  credentials: {{username: {registry.user}, password_secret: REGISTRY_TOKEN}}\n"
        f'  volumes: ["{volume}"]\n'
        "secrets: {REGISTRY_TOKEN: null}\n"
    )


def rank_starts(home: Path, job_id: str) -> list[float]:
    """The times the job's ranks printed at their start, from the node logs orch keeps."""
    times = []
    for log in sorted((home / "jobs" / job_id / "logs").glob("node-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "rank-started" in line:
                times.append(float(line.split()[-1]))
    return times


@dataclasses.dataclass(frozen=True)
class Start:
    seconds: float  # REUSED (nodes up) -> the last rank started
    image_event: str  # the IMAGE event's text ("" for a bare job)
    events: list[tuple[str, float]]  # (kind, seconds after REUSED)


def timed_job(root: Path, env: dict[str, str], name: str, spec_text: str) -> Start:
    spec = root / f"{name}.yaml"
    spec.write_text(spec_text)
    job_id = detach(spec, env, "--cluster", "bench", "--autostop", "30m")
    job = wait_for_state(job_id, env, {"SUCCEEDED", "FAILED"}, timeout=300)
    if job["state"] != "SUCCEEDED":
        raise RuntimeError(f"{name} failed: {json.dumps(job)[-3000:]}")
    job = job_json(job_id, env)
    # REUSED: the kept nodes are the job's; a cluster's first job launches them instead
    first = {e["kind"]: e["at"] for e in reversed(job["events"])}
    up = at(first.get("REUSED") or first["PROVISIONING"])
    starts = rank_starts(Path(env["ORCH_HOME"]), job_id)
    if len(starts) != RANKS:
        raise RuntimeError(f"{name}: {len(starts)} rank(s) printed their start, not {RANKS}")
    image = [e["message"] for e in job["events"] if e["kind"] == "IMAGE"]
    return Start(
        max(starts) - up,
        image[0] if image else "",
        [(e["kind"], at(e["at"]) - up) for e in job["events"]],
    )


def start_overhead(registry: Registry, repeats: int) -> tuple[list[float], list[float]]:
    """(container starts, bare starts), seconds, alternating on one kept cluster."""
    image = offline_image()
    ref = push_image(image, registry, "bench/train")
    volume, site = torch_volume()
    boxed: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-box-") as tmp:
        root = Path(tmp)
        (root / "work").mkdir()
        (root / "work" / "probe.py").write_text(PROBE)
        env = fast_env(
            root / "orch",
            ORCH_LOCAL_INSECURE_REGISTRIES=registry.address,
            REGISTRY_TOKEN=registry.password,
        )
        try:
            first = timed_job(root, env, "first", job_spec("first", registry, ref, volume, site))
            print(f"  first job (pulls the image): {first.image_event}", flush=True)
            for rep in range(repeats):
                jobs: list[tuple[str, Registry | None, list[float]]] = [
                    ("boxed", registry, boxed), ("bare", None, bare),
                ]  # fmt: skip
                for kind, reg, into in jobs if rep % 2 == 0 else jobs[::-1]:
                    name = f"{kind}-{rep}"
                    start = timed_job(root, env, name, job_spec(name, reg, ref, volume, site))
                    into.append(start.seconds)
                    marks = ", ".join(f"{k} {s:+.2f}" for k, s in start.events)
                    print(f"  rep {rep} {kind}: {start.seconds:.2f} s  [{marks}]", flush=True)
        finally:
            run_orch(["down", "bench"], env, timeout=120)
    return boxed, bare


# --- pull ---------------------------------------------------------------------------------------


def with_registry(cluster: Cluster, registry: Registry) -> list[PullPlan]:
    """orch's pull plans for `cluster`'s nodes, the registry's address allowed over HTTP."""
    plans = []
    for instance in cluster.instances:
        runtime = instance.container_runtime
        assert runtime is not None, "local nodes run containers in namespace mode only (root)"
        plans.append(
            PullPlan(
                image="",
                registry=registry.address,
                runtime=dataclasses.replace(runtime, insecure_registries=(registry.address,)),
                auth_dir=home_expr(f"{NodeLayout('bench-pull').run_dir}/registry-auth"),
                username=registry.user,
            )
        )
    return plans


def pull_benchmark(registry: Registry, random_mb: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of each kind of pull, `repeats` of each, interleaved."""
    times: dict[str, list[float]] = {k: [] for k in ("raw1", "orch2", "raw2", "orch1")}
    with local_nodes(2, network="namespace") as nodes:
        image = big_image(registry, offline_image(), random_mb)
        print(
            f"  image {image.ref}: random layer written in {image.layer_s:.1f} s, "
            f"imported, built and pushed in {image.push_s:.1f} s (0.0: cached)",
            flush=True,
        )
        subprocess.run(
            ["sh", "-c", f"find {registry.root}/data/ -type f -exec cat {{}} + >/dev/null"],
            check=True,
        )  # the registry's files in memory for every pull alike
        cluster = nodes.cluster
        plans = [dataclasses.replace(p, image=image.ref) for p in with_registry(cluster, registry)]
        podman = plans[0].runtime.command
        prepare = plans[0].runtime.prepare
        auth = "/root/.orch-bench-auth.json"
        login = (
            f"{prepare} && {podman} login --tls-verify=false --authfile {auth} "
            f"-u {registry.user} --password-stdin {registry.address} >/dev/null"
        )
        cluster.map(lambda _r, c: c.run(login, stdin=registry.password, timeout=120))
        remove = f"{podman} rmi -f {image.ref} >/dev/null 2>&1; sync"
        raw = f"{podman} pull --tls-verify=false --authfile {auth} {image.ref}"
        one = Cluster(cluster.instances[:1], cluster.identity)

        def clean() -> None:
            cluster.map(lambda _r, c: c.run(remove, timeout=300))
            subprocess.run(["sync"], check=True)

        def raw_pull(on: Cluster) -> float:
            started = time.perf_counter()
            on.map(lambda _r, c: c.run(raw, timeout=1800))
            return time.perf_counter() - started

        def orch_pull(on: Cluster) -> float:
            started = time.perf_counter()
            report = pull_image(
                on, plans[: len(on.instances)], password=registry.password, progress=lambda _t: None
            )
            assert report.pulled == len(on.instances), report
            return time.perf_counter() - started

        kinds: list[tuple[str, Callable[[], float]]] = [
            ("raw1", lambda: raw_pull(one)),
            ("orch2", lambda: orch_pull(cluster)),
            ("raw2", lambda: raw_pull(cluster)),
            ("orch1", lambda: orch_pull(one)),
        ]
        try:
            for rep in range(repeats):
                for kind, fn in kinds if rep % 2 == 0 else kinds[::-1]:
                    clean()
                    times[kind].append(fn())
                    print(f"  rep {rep} {kind}: {times[kind][-1]:.2f} s", flush=True)
        finally:
            one.close()
    return times


def ensure_bridge() -> None:
    """The nodes' bridge, made unless a node made it: the registry listens on its address
    before any node of this run exists."""
    made = subprocess.run(["ip", "link", "show", "dev", BRIDGE], capture_output=True)
    if made.returncode != 0:
        for argv in net.bridge_create_argvs(BRIDGE, SUBNET):
            subprocess.run(argv, check=True, capture_output=True)


# --- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=6, help="start-overhead jobs of each kind")
    parser.add_argument("--pulls", type=int, default=3, help="pulls of each kind")
    parser.add_argument("--random-mb", type=int, default=1900, help="the image's random layer")
    parser.add_argument("--only", choices=("start", "pull"))
    args = parser.parse_args()
    ensure_bridge()
    rows: list[Row] = []
    try:
        address = str(net.bridge_address(SUBNET))
        with running_registry(address, registry_storage(args.random_mb)) as registry:
            if args.only != "pull":
                boxed, bare = start_overhead(registry, args.repeats)
                rows.append(("start in the image, nodes have it (2 x 2)", median(boxed), "s",
                             median(bare), "the same job on the bare nodes",
                             "ratio <= 1.15"))  # fmt: skip
            if args.only != "start":
                pulls = pull_benchmark(registry, args.random_mb, args.pulls)
                size = f"{args.random_mb + 56} MiB"
                raw1 = median(pulls["raw1"])
                print(f"  raw pulls to 2 nodes at once took {median(pulls['raw2']) / raw1:.2f}x "
                      "one raw pull: the nodes share this machine's cores and disk")  # fmt: skip
                rows += [
                    (f"pull of {size} to 2 nodes at once", median(pulls["orch2"]), "s", raw1,
                     "one raw podman pull to 1 node", "ratio <= 1.1"),
                    (f"pull of {size} to 1 node", median(pulls["orch1"]), "s", raw1,
                     "one raw podman pull to 1 node", "-"),
                    (f"pull of {size} to 2 nodes, orch vs raw", median(pulls["orch2"]), "s",
                     median(pulls["raw2"]), "raw podman pulls to 2 nodes at once", "-"),
                ]  # fmt: skip
    finally:
        with tempfile.TemporaryDirectory(prefix="orch-bench-net-") as home:
            LocalProvider(Settings(home=Path(home), local=LocalSettings())).cleanup_network()
    return 0 if report_targets("containers", rows) else 1


if __name__ == "__main__":
    sys.exit(main())
