"""Launch overhead: from nodes up to every rank started, orch against ssh + torchrun by hand.

Two local nodes x 2 processes. The baseline is what a user would type: one `ssh node torchrun
...` per node, in parallel, watching their output. orch does what `orch submit` does once the
nodes are up: find a free master port on node 0, write each node's launch script, start it
detached, and watch the node logs over its persistent connections. Both are timed until all
four ranks have printed their first line. Prints medians and the orch/baseline ratio.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Nodes, local_nodes, median, report  # noqa: E402
from orchestrator.control.run.runner import start_on_nodes  # noqa: E402
from orchestrator.node import launch  # noqa: E402
from orchestrator.remote.sync import (  # noqa: E402
    Transfer,
    push_argv,
    run_parallel,
    ssh_transport_argv,  # noqa: E402
)

PROCS = 2
PROBE = "import os, time; print('rank-started', os.environ['RANK'], flush=True); time.sleep(2)\n"


def wait_until(condition, timeout: float = 120.0, interval: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("ranks did not start")
        time.sleep(interval)


def orch_launch(nodes: Nodes, job_id: str) -> float:
    cluster = nodes.cluster
    layout = launch.NodeLayout(job_id)
    run_parallel(
        [
            Transfer(a.name, push_argv(WORKDIR, a, cluster.identity, layout.workdir, workdir=True))
            for a in cluster.addresses
        ]
    )
    start = time.perf_counter()
    port = int(cluster.head.run(launch.free_port_command()).stdout)
    start_on_nodes(
        cluster,
        launch.ClusterLaunch(
            job_id=job_id,
            run="python probe.py",
            setup=None,
            num_nodes=len(cluster.instances),
            procs_per_node=PROCS,
            master_addr=cluster.instances[0].private_ip,
            master_port=port,
            node_ips=[i.private_ip for i in cluster.instances],
            checkpoint_dir=layout.default_checkpoint_dir,
        ),
    )
    log = launch.home_expr(layout.log)

    def started() -> bool:
        counts = cluster.map(
            lambda _r, c: int(c.run(f"grep -c rank-started {log} || true").stdout or 0)
        )
        return sum(counts) == PROCS * len(counts)

    wait_until(started)
    elapsed = time.perf_counter() - start

    def finished() -> bool:
        probes = cluster.map(
            lambda _r, c: launch.parse_probe(c.run(launch.probe_command(layout, None)).stdout)
        )
        return all(p.state == "exited" for p in probes)

    wait_until(finished, interval=0.5)
    return elapsed


def baseline_launch(nodes: Nodes, tmp: Path, rep: int) -> float:
    cluster = nodes.cluster
    workdir = f"by-hand-{rep}"
    for address in cluster.addresses:
        transport = shlex.join(ssh_transport_argv(address, cluster.identity, 10, multiplex=False))
        target = f"{address.user}@{address.host}:{workdir}/"
        subprocess.run(["rsync", "-a", "-e", transport, f"{WORKDIR}/", target], check=True)
    master = cluster.instances[0].private_ip
    outputs = [tmp / f"out-{rep}-{rank}" for rank in range(len(cluster.addresses))]
    start = time.perf_counter()
    procs = []
    for rank, (address, out) in enumerate(zip(cluster.addresses, outputs, strict=True)):
        remote = (
            f"cd {workdir} && GLOO_SOCKET_IFNAME={cluster.instances[rank].interface} "
            f"torchrun --nnodes=2 --nproc_per_node={PROCS} --node_rank={rank} "
            f"--master_addr={master} --master_port={29600 + rep} probe.py"
        )
        target = f"{address.user}@{address.host}"
        transport = ssh_transport_argv(address, cluster.identity, 10, multiplex=False)
        argv = [*transport, target, remote]
        procs.append(subprocess.Popen(argv, stdout=out.open("w"), stderr=subprocess.STDOUT))

    def started() -> bool:
        return sum(o.read_text().count("rank-started") for o in outputs) == PROCS * len(outputs)

    wait_until(started)
    elapsed = time.perf_counter() - start
    for proc in procs:
        proc.wait(timeout=120)
    return elapsed


WORKDIR = Path(tempfile.mkdtemp(prefix="orch-bench-work-"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    (WORKDIR / "probe.py").write_text(PROBE)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp, local_nodes(2) as nodes:
        for rep in range(args.repeats):
            theirs.append(baseline_launch(nodes, Path(tmp), rep))
            ours.append(orch_launch(nodes, f"bench-{rep}"))
            print(f"  rep {rep}: orch {ours[-1]:.2f} s, by hand {theirs[-1]:.2f} s", flush=True)
    ok = report(
        "launch overhead, nodes up -> 4 ranks started (2 nodes x 2 procs)",
        [("orch start + watch", median(ours), median(theirs))],
        target=1.3,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
