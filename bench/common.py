"""Shared set-up of the benchmarks: a private ORCH_HOME with local nodes, and timing helpers."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

from orchestrator.cluster.connections import Cluster
from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.base import LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity


@dataclass
class Nodes:
    provider: LocalProvider
    cluster: Cluster
    ids: list[str]


@contextmanager
def local_nodes(
    count: int, *, network: str = "auto", bridge: tuple[str, IPv4Network] | None = None
) -> Iterator[Nodes]:
    """`count` fresh local nodes in a throw-away ORCH_HOME; always terminated afterwards.
    `bridge`: namespace nodes on a bridge and subnet of their own, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as home:
        own = {"bridge": bridge[0], "subnet": bridge[1]} if bridge else {}
        settings = Settings(home=Path(home), local=LocalSettings(network=network, **own))  # type: ignore[arg-type]
        provider = LocalProvider(settings)
        identity = ensure_identity(settings.keys_dir("bench"), "orch-bench")
        instances = provider.launch(
            LaunchRequest(
                job_id="bench", cluster="bench", count=count, gpus_per_node=1,
                public_key=identity.public_key,
            )
        )  # fmt: skip
        cluster = Cluster(instances, identity)
        try:
            yield Nodes(provider, cluster, [i.instance_id for i in instances])
        finally:
            cluster.close()
            provider.terminate([i.instance_id for i in instances])
            if bridge:
                provider.cleanup_network()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    mem = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.split("\n")[1]
    return f"{cpu} cores, {mem.split()[1]} GiB RAM"


def report(title: str, rows: list[tuple[str, float, float]], target: float) -> bool:
    """Print `name: orch / baseline = ratio` rows (medians, seconds); True when all meet target."""
    print(f"\n{title}  (machine: {machine()}; medians; target ratio <= {target})")
    ok = True
    for name, ours, baseline in rows:
        ratio = ours / baseline
        ok &= ratio <= target
        print(f"  {name:<28} orch {ours:7.3f} s   baseline {baseline:7.3f} s   ratio {ratio:5.2f}")
    return ok


Row = tuple[str, float, str, float, str, str]  # name, orch, unit, baseline, its name, target


def report_targets(title: str, rows: list[Row]) -> bool:
    """Print rows with their own baselines and targets (`ratio <= N`, `ratio >= N`, `<= N`,
    or `-`), as `bench.figures.parse_checkpoint_speed` reads them; True when all are met."""
    print(f"\n{title} (machine: {machine()}; medians)")
    ok = True
    for name, ours, unit, base, base_name, target in rows:
        ratio = ours / base
        print(f"  {name:<44} orch {ours:9.3f} {unit:<8} baseline {base:9.3f} {unit:<8} "
              f"({base_name})  ratio {ratio:5.2f}  target {target}")  # fmt: skip
        if target.startswith("ratio <="):
            ok &= ratio <= float(target.split()[-1])
        elif target.startswith("ratio >="):
            ok &= ratio >= float(target.split()[-1])
        elif target.startswith("<="):
            ok &= ours <= float(target.split()[1])
    return ok


def at(text: str) -> float:
    """An ISO 8601 time (the ledger's events and leases) as epoch seconds."""
    return datetime.fromisoformat(text).timestamp()


def wait(predicate: Callable[[], Any], what: str, timeout: float = 300, every: float = 0.1) -> Any:
    """`predicate()`'s first true value, asked every `every` seconds; RuntimeError naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
