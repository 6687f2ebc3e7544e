"""The job's data onto an attempt's nodes (SYNCING), and its outputs off them at the end.

Local data crosses this machine's uplink once: it goes to one node, then node to node over the
cluster's network (`cluster.data_fanout`). Bucket data goes straight from the bucket to every
node (`cluster.bucket_transfers`), each node downloading only what its cache lacks; a node that
joins a run whose other nodes stayed (a replacement) first takes a stayed node's whole copy over
the cluster's network. Outputs go from the nodes straight to their bucket.

While data moves, the foreground view shows bytes, rate and time left each second and a DATA
event says the same every `EVENT_EVERY_S`, so a long download never looks like a hang. The
phase counts like any other: the budget is checked while it runs (a cap reached stops the job
as BUDGET_STOPPED), and a phase that moves no byte for `recovery.start_timeout` fails the job.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cluster.bucket_transfers import BucketWork, Tick, human_bytes, run_bucket_work
from orchestrator.cluster.checkpoints.store import node_access
from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.data_fanout import (
    FanOutResult,
    TransferProgress,
    copy_between_nodes,
    node_to_node,
    send_local_data,
)
from orchestrator.config import Settings
from orchestrator.control.money.stop_rules import StopOrder, budget_order
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter, RunnerOptions
from orchestrator.errors import DataError, OrchError
from orchestrator.ledger.store import hourly_rate, total_cost, utcnow
from orchestrator.node.bucket_lines import BucketLines
from orchestrator.node.checkpoint_protocol import StoreAccess
from orchestrator.node.launch import home_relative
from orchestrator.spec.model import DataMount, LoadedJob

EVENT_EVERY_S = 30.0  # a DATA event with the phase's progress at most this often
BUDGET_EVERY_S = 10.0  # the budget is read from the ledger at most this often
CONCURRENCY = 16  # objects (and parts) each node moves at once
OUTPUT_TIMEOUT_S = 900.0
NODE_TO_NODE = "local data, node to node"  # the most an upload of outputs may take at a job's end


class PhaseStopped(OrchError):
    """A data phase stopped by one of the job's caps; `order` is how the job ends."""

    def __init__(self, order: StopOrder) -> None:
        super().__init__(order.reason)
        self.order = order
        self.exit_code = order.exit_code


def manifest_path(node_path: str) -> str:
    """Where `bucket-data` keeps the cache manifest of a destination: beside it, hidden."""
    parent, _, name = node_path.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.orch-data.json" if parent else f".{name}.orch-data.json"


@dataclass
class _Watch:
    """The phase's limits, checked on each tick: the budget and a phase that stopped moving."""

    step: DataStep
    started: float = field(default_factory=lambda: time.monotonic())
    moved_at: float = field(default_factory=lambda: time.monotonic())
    moved: int = -1
    budget_read_at: float = 0.0
    event_at: float = field(default_factory=lambda: time.monotonic())

    def __call__(self, tick: Tick) -> None:
        now = time.monotonic()
        step = self.step
        step.reporter.phase(tick.describe())
        if now - self.event_at >= EVENT_EVERY_S:
            self.event_at = now
            step.journal.event("DATA", tick.describe())
        if tick.done > self.moved:
            self.moved, self.moved_at = tick.done, now
        quiet = step.loaded.spec.recovery.start_timeout
        # The node-to-node stage counts its bytes as each copy ends, so a long copy is quiet
        # while it moves: only stages that count as they go are judged.
        judged = tick.stage != NODE_TO_NODE
        if judged and quiet is not None and now - self.moved_at > quiet and tick.done < tick.total:
            raise DataError(
                f"{tick.stage}: no byte moved for {now - self.moved_at:.0f} s "
                f"(recovery.start_timeout {quiet:.0f} s)",
                hint="the nodes cannot reach the source: check its address and the nodes' "
                "network, then submit again",
            )
        if now - self.budget_read_at >= BUDGET_EVERY_S:
            self.budget_read_at = now
            step.check_budget()


class DataStep:
    """Moves a job's data and outputs; never ends a node (the runner does, whatever fails)."""

    def __init__(
        self,
        *,
        journal: Journal,
        reporter: Reporter,
        loaded: LoadedJob,
        settings: Settings,
        options: RunnerOptions,
    ) -> None:
        self.journal = journal
        self.reporter = reporter
        self.loaded = loaded
        self.settings = settings
        self.options = options

    # --- limits -------------------------------------------------------------------------------
    def check_budget(self) -> None:
        """Raise `PhaseStopped` once the job's budget is (about to be) reached."""
        budget = self.loaded.spec.budget
        if budget.max_cost_usd is None and budget.max_hourly_usd is None:
            return
        leases = self.journal.ledger.leases(self.journal.job.id)
        order = budget_order(
            spend=total_cost(leases, utcnow()),
            hourly_rate=hourly_rate(leases),
            max_cost=budget.max_cost_usd,
            max_hourly=budget.max_hourly_usd,
            horizon_s=BUDGET_EVERY_S + self.options.stop_allowance,
        )
        if order is not None:
            raise PhaseStopped(order)

    # --- data onto the nodes -----------------------------------------------------------------
    def bring(
        self, attempt: Attempt, *, stayed: Collection[int] = (), low_priority: bool = False
    ) -> None:
        """Put every `data` entry on every node of `attempt`. `stayed`: ranks whose nodes were
        up before this attempt (a kept cluster's, the survivors of a partial replacement):
        they hold earlier copies, which the transfers only bring up to date."""
        spec = self.loaded.spec
        if not spec.data:
            return
        cluster = attempt.cluster
        self.check_budget()
        self._local(cluster, stayed, low_priority)
        self._buckets(cluster, attempt, stayed)

    def _local(self, cluster: Cluster, stayed: Collection[int], low_priority: bool) -> None:
        spec, loaded = self.loaded.spec, self.loaded
        sources: list[tuple[Path, str]] = []
        for i, (mount, source) in enumerate(zip(spec.data, loaded.data_sources, strict=True)):
            if source is None:
                continue
            if not source.exists():
                raise DataError(
                    f"data[{i}].src {mount.src} ({source}) no longer exists on this machine",
                    hint="put it back (or change the spec and submit a new job); nothing of "
                    "the job is left running",
                )
            sources.append((source, mount.dst))
        if not sources:
            return
        watch = _Watch(self)
        started = time.monotonic()
        result = send_local_data(
            cluster,
            sources,
            holders=sorted(stayed),
            progress=lambda p: watch(_tick_of(p)),
            timeout=self.options.push_timeout,
            low_priority=low_priority,
        )
        self.journal.event(
            "DATA", f"{len(sources)} local path(s) to {len(cluster.instances)} node(s) in "
            f"{time.monotonic() - started:.1f} s: {fanout_summary(result)}",
        )  # fmt: skip

    def _buckets(self, cluster: Cluster, attempt: Attempt, stayed: Collection[int]) -> None:
        spec = self.loaded.spec
        entries = [(i, m, url) for i, m in enumerate(spec.data) if (url := m.bucket_url)]
        if not entries:
            return
        ranks = range(len(cluster.instances))
        joining = [r for r in ranks if r not in stayed]
        if stayed and joining and node_to_node(cluster):  # allocations fetch on their own
            self._copy_from_stayed(cluster, entries, sorted(stayed), joining)
        work = {
            rank: [
                BucketWork(
                    f"data[{i}] {url} -> {mount.dst}",
                    "fetch",
                    {"url": url, "dst": home_relative(mount.dst), "concurrency": CONCURRENCY},
                )
                for i, mount, url in entries
            ]
            for rank in ranks
        }
        access = self._access(attempt)
        watch = _Watch(self)
        said = run_bucket_work(
            cluster,
            work,
            lambda entry: access(str(entry.document["url"])),
            stage="bucket data",
            progress=watch,
            timeout_s=self.options.push_timeout,
        )
        for n, (i, mount, url) in enumerate(entries):
            runs = [said[rank][n] for rank in ranks]
            self.journal.event("DATA", f"data[{i}] {url} -> {mount.dst}: {fetch_summary(runs)}")

    def _copy_from_stayed(
        self,
        cluster: Cluster,
        entries: list[tuple[int, DataMount, str]],
        stayed: list[int],
        joining: list[int],
    ) -> None:
        """Give the joining nodes a stayed node's copy of each bucket source (and its cache
        manifest) over the cluster's network: inside one cluster that beats the bucket, and the
        fetch that follows then finds next to nothing to download. Best effort: a copy that
        fails leaves the fetch to get everything from the bucket."""
        paths: list[str] = []
        for _i, mount, _url in entries:
            dst = home_relative(mount.dst)
            paths += [dst, manifest_path(dst)]
        started = time.monotonic()
        try:
            copy_between_nodes(cluster, paths, stayed[0], joining)
        except OrchError as exc:
            self.journal.event(
                "WARNING", f"copy of the bucket data from node {stayed[0]} failed "
                f"({exc.message}); the new node(s) fetch it from the bucket",
            )  # fmt: skip
            return
        self.journal.event(
            "DATA", f"bucket data copied from node {stayed[0]} to node(s) "
            f"{', '.join(map(str, joining))} in {time.monotonic() - started:.1f} s",
        )  # fmt: skip

    def _access(self, attempt: Attempt) -> _AccessCache:
        return _AccessCache(self.settings, attempt.node_access())

    # --- outputs off the nodes ---------------------------------------------------------------
    def upload_outputs(
        self,
        attempt: Attempt,
        *,
        ranks: Collection[int] | None,
        why: str,
        timeout_s: float = OUTPUT_TIMEOUT_S,
    ) -> None:
        """Upload each `outputs` entry from the nodes that hold it (node 0, or every node with
        `nodes: all`, each under `node-<rank>/`), of `ranks` only when given. Never raises for a
        node's failure: an OUTPUTS event says what each node uploaded or why it could not, and
        `orch status JOB` lists them."""
        spec = self.loaded.spec
        if not spec.outputs or not attempt.connected:
            return
        cluster = attempt.cluster
        gone = set(attempt.gone_ranks)
        work: dict[int, list[BucketWork]] = {}
        for i, output in enumerate(spec.outputs):
            for rank in range(len(cluster.instances)):
                if (ranks is not None and rank not in ranks) or (
                    output.nodes == "head" and rank != 0
                ):
                    continue
                url = output.dst if output.nodes == "head" else f"{output.dst}/node-{rank}"
                if rank in gone:
                    self.journal.event(
                        "OUTPUTS", f"{output_label(i, rank, output.src, url)}: not uploaded, the "
                        f"node is gone ({why})",
                    )  # fmt: skip
                    continue
                work.setdefault(rank, []).append(
                    BucketWork(
                        output_label(i, rank, output.src, url),
                        "upload",
                        {"src": home_relative(output.src), "url": url, "concurrency": CONCURRENCY},
                    )
                )
        if not work:
            return
        self.reporter.phase(f"uploading outputs ({why})")
        access = self._access(attempt)
        try:
            said = run_bucket_work(
                cluster, work, lambda entry: access(str(entry.document["url"])),
                stage="outputs", progress=lambda tick: self.reporter.phase(tick.describe()),
                timeout_s=timeout_s,
            )  # fmt: skip
        except OrchError as exc:
            self.journal.event("OUTPUTS", f"failed ({why}): {exc.message}")
            return
        for rank, entries in work.items():
            for entry, run in zip(entries, said.get(rank, []), strict=False):
                self.journal.event("OUTPUTS", f"{entry.label}: {upload_summary(run)} ({why})")


class _AccessCache:
    """How the nodes reach each bucket, resolved once per phase (credentials included)."""

    def __init__(self, settings: Settings, node_fields: dict[str, object]) -> None:
        self.settings = settings
        self.node_fields = node_fields
        self.found: dict[str, StoreAccess] = {}

    def __call__(self, url: str) -> StoreAccess:
        if url not in self.found:
            self.found[url] = node_access(
                url, self.settings,
                nodes_have_credentials=bool(self.node_fields.get("nodes_have_credentials")),
                region=self.node_fields.get("region"),  # type: ignore[arg-type]
            )  # fmt: skip
        return self.found[url]


def output_label(index: int, rank: int, src: str, url: str) -> str:
    """How an OUTPUTS event names one upload: `outputs[0] node 0: ~/out -> s3://b/p`."""
    return f"outputs[{index}] node {rank}: {src} -> {url}"


def upload_summary(run: BucketLines) -> str:
    """`12 file(s), 3.4 MiB in 2.1 s` (or that there was nothing to upload)."""
    done = run.done or {}
    if done.get("missing"):
        return "nothing to upload (no such path on the node)"
    files, size = int(done.get("files", 0)), int(done.get("bytes", 0))
    skipped = int(done.get("skipped", 0))
    tail = f", {skipped} symlink(s) skipped" if skipped else ""
    took = float(done.get("seconds", 0))
    return f"uploaded {files} file(s), {human_bytes(size)} in {took:.1f} s{tail}"


def fetch_summary(runs: list[BucketLines]) -> str:
    """One source's fetch over all nodes: objects, what was downloaded and what was kept."""
    fetched = sum(int((r.done or {}).get("fetched", 0)) for r in runs)
    moved = sum(int((r.done or {}).get("bytes", 0)) for r in runs)
    kept = sum(int((r.done or {}).get("kept", 0)) for r in runs)
    removed = sum(int((r.done or {}).get("removed", 0)) for r in runs)
    objects = max((int((r.done or {}).get("objects", 0)) for r in runs), default=0)
    took = max((float((r.done or {}).get("seconds", 0)) for r in runs), default=0.0)
    text = (
        f"{objects} object(s) on {len(runs)} node(s): downloaded {fetched} "
        f"({human_bytes(moved)}), kept {kept} from the nodes' cache"
    )
    if removed:
        text += f", removed {removed} gone from the bucket"
    return f"{text}, {took:.1f} s"


def _tick_of(progress: TransferProgress) -> Tick:
    """The fan-out's progress as a `Tick` (its seconds from its bytes and rate)."""
    seconds = progress.bytes / progress.rate if progress.rate > 0 else 0.0
    stage = (
        "local data over the uplink" if progress.stage == "uplink" else "local data, node to node"
    )
    return Tick(stage, progress.bytes, progress.total, seconds)


def fanout_summary(result: FanOutResult) -> str:
    """`48.0 MiB brought to node 0 over the uplink in 2.1 s, then node to node in 1.5 s`: the
    data's size, not what crossed the wire (a node holding an earlier copy gets the changes)."""
    return (
        f"{human_bytes(result.uplink.bytes)} brought to node {result.uplink_rank} over the "
        f"uplink in {result.uplink.seconds:.1f} s, then node to node in "
        f"{result.fanout.seconds:.1f} s"
    )
