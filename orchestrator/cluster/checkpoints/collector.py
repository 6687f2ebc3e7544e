"""Bringing a job's complete checkpoints home from every node into the mirror.

One `collect()`: read every answering node's agent manifest (one command each, in parallel);
work out the complete checkpoints (`checkpoint_units.find_units`); decide what this pull may
bring (`limits.plan_pull`: the size cap and the free disk); fetch the staged copies the
mirror lacks from the nodes that hold them (rsync, the nodes in parallel); for copies that are
hard links to the node's own file, check on the node that the file did not change during the
transfer; install each checkpoint atomically; then prune by the mirror mode. A node that cannot
be reached, or is lost mid-transfer, gives nothing this time: its checkpoints wait for the next
collection, and the mirror keeps what it had. Any other failure is raised once every node's
transfer has ended, with the mirror as it was before the failed checkpoint.

What a node sends is bounded by what its manifest reported: a transfer that passes that many
bytes is cut off (within `WATCH_S` plus rsync's own abort poll), and a copy whose size is not
the reported one is not installed. Both are notices (`Collected.notices`), never failures:
the node's word is wrong, and waiting will not make it right.

Mirror modes (`checkpoint.mirror`): `all` keeps every complete checkpoint the nodes still hold
and the newest one in any case; `latest` keeps the newest directory checkpoint (and every
single-file one); `none` fetches nothing (a store keeps the bytes).
"""

from __future__ import annotations

import os
import shlex
import shutil
import threading
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cluster.checkpoints.limits import Disk, plan_pull, size_text
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.units import (
    Unit,
    UnitFile,
    find_units,
    newer,
    present_directories,
)
from orchestrator.cluster.connections import Cluster
from orchestrator.errors import CheckpointError, NodeUnreachable, OrchError
from orchestrator.node.checkpoint_files import shown
from orchestrator.node.checkpoint_protocol import (
    AgentLayout,
    AgentReport,
    NodeManifest,
    Notice,
    StoreKeys,
    parse_report,
    read_command,
)
from orchestrator.node.launch import home_expr
from orchestrator.remote.sync import pull_argv, run_rsync

MIRROR_MODES = ("all", "latest", "none")
# A node's manifest longer than this is not read (one of a checkpoint of many thousand files
# is a few MB); the node's checkpoints wait until it is back under it.
MANIFEST_MAX_BYTES = 32 * 1024 * 1024
WATCH_S = 0.05  # how often a transfer's bytes are counted against what the node reported

STAT_OBJECTS = (
    "import os, sys\n"
    "for name in sys.stdin.read().split():\n"
    "    try:\n"
    "        s = os.lstat(name)\n"
    "        print(name, s.st_size, s.st_mtime_ns, s.st_ctime_ns)\n"
    "    except OSError:\n"
    "        print(name, -1, -1, -1)\n"
)


@dataclass
class Collected:
    """What one collection found and did."""

    installed: list[Unit] = field(default_factory=list)  # new in the mirror
    complete: list[Unit] = field(default_factory=list)  # every complete checkpoint reported
    reports: dict[int, AgentReport] = field(default_factory=dict)  # by rank, nodes that answered
    pruned: list[str] = field(default_factory=list)  # directory checkpoints removed
    notices: list[Notice] = field(default_factory=list)  # what was refused (see `limits`)

    @property
    def manifests(self) -> dict[int, NodeManifest]:
        return {r: rep.manifest for r, rep in self.reports.items() if rep.manifest is not None}


class CheckpointCollector:
    """Collects from one cluster into one mirror; see the module docstring. One caller at a
    time (a lock serializes them); `timeout_s` bounds one node's transfer, `max_pull_bytes`
    one checkpoint and one collection (0: no cap). `keys`: the job's store keys (None
    without a store)."""

    def __init__(
        self,
        cluster: Cluster,
        mirror: CheckpointMirror,
        layout: AgentLayout,
        *,
        mode: str = "all",
        timeout_s: float = 3600.0,
        max_pull_bytes: int = 0,
        keys: StoreKeys | None = None,
    ) -> None:
        if mode not in MIRROR_MODES:
            raise ValueError(f"unknown mirror mode {mode!r}")
        self.cluster = cluster
        self.mirror = mirror
        self.layout = layout
        self.mode = mode
        self.timeout_s = timeout_s
        self.oversized: set[int] = set()  # ranks whose manifest was past the cap at the last read
        self.max_pull_bytes = max_pull_bytes
        self.keys = keys
        self._lock = threading.Lock()

    def read(self, skip: Collection[int] = ()) -> dict[int, AgentReport]:
        """Every answering node's agent report, by rank; nodes in `skip` are not asked. A
        manifest longer than `MANIFEST_MAX_BYTES` is not read: its node reports no manifest
        this time, and is in `oversized`."""

        def one(rank: int, connection) -> AgentReport | None:  # noqa: ANN001 - NodeConnection
            if rank in skip:
                return None
            sent = time.time_ns()
            try:
                result = connection.run(
                    read_command(self.layout), timeout=30, check=False,
                    max_output=MANIFEST_MAX_BYTES,
                )  # fmt: skip
            except NodeUnreachable:
                return None
            output = result.stdout
            if result.cut:  # a manifest past the cap is not read: the state line alone
                output = output[: output.find("\n") + 1]
                oversized.add(rank)
            return parse_report(output, rank, sent, time.time_ns(), self.keys)

        oversized: set[int] = set()
        reports = self.cluster.map(one)
        self.oversized = oversized
        return {rank: report for rank, report in enumerate(reports) if report is not None}

    def collect(
        self,
        *,
        skip: Collection[int] = (),
        aborts: Mapping[int, threading.Event] | None = None,
    ) -> Collected:
        """One collection (see the module docstring). `aborts[rank]`, once set, cuts that
        node's transfer short (it was found gone)."""
        with self._lock:
            try:
                return self._collect(set(skip), aborts or {})
            except OSError as exc:  # this machine's side: the mirror's disk, most likely
                raise CheckpointError(
                    f"checkpoint pull: {exc}",
                    hint=f"check the disk of {self.mirror.root.parent} (free space, "
                    "permissions); the mirror keeps what it had",
                ) from exc

    def _collect(self, skip: set[int], aborts: Mapping[int, threading.Event]) -> Collected:
        result = Collected(reports=self.read(skip))
        manifests = result.manifests
        ranks = range(len(self.cluster.instances))
        result.complete = find_units(manifests, ranks)
        wanted = self._plan(self._wanted(result.complete), result.notices)
        needed: dict[int, dict[str, UnitFile]] = {}
        for unit in wanted:
            for f in self._missing(unit):
                needed.setdefault(f.rank, {})[f.object] = f  # type: ignore[index]
        fetched, failed_ranks, error = self._fetch(needed, aborts, result.notices)
        changed = self._changed_links(needed, fetched, failed_ranks)
        try:
            for unit in wanted:
                if any(f.path in changed for f in unit.files):
                    continue  # (one that needed a lost node's files finds them missing below)
                sources = {
                    f.path: fetched[f.rank][f.object]
                    for f in unit.files
                    if f.object is not None and f.object in fetched.get(f.rank, {})
                }
                if self.mirror.install(unit, sources):
                    result.installed.append(unit)
            result.pruned = self._prune(manifests, ranks)
        finally:
            self.mirror.clear_incoming()
        if error is not None:
            raise error
        return result

    def _wanted(self, units: list[Unit]) -> list[Unit]:
        if self.mode == "none":
            return []
        files = [u for u in units if u.kind == "file" and not self.mirror.holds_unit(u)]
        directories = [u for u in units if u.kind != "file"]
        if self.mode == "latest":
            directories = directories[-1:] if directories else []
            held = self.mirror.newest_directory()
            if (
                directories
                and held is not None
                and held.name != directories[0].name
                and (-1 if held.step is None else held.step, held.written_ns)
                > newer(directories[0])
            ):
                directories = []  # the mirror holds a newer one than the nodes now do
        return [u for u in directories if not self.mirror.holds_unit(u)] + files

    def _missing(self, unit: Unit) -> list[UnitFile]:
        """The files of `unit` to fetch: what the mirror lacks and a node holds a copy of."""
        return [
            f
            for f in unit.files
            if f.object is not None and not self.mirror.holds(f.path, f.digest)
        ]

    def _plan(self, wanted: list[Unit], notices: list[Notice]) -> list[Unit]:
        """The units this pull may bring (`limits.plan_pull`); refusals go to `notices`."""
        if not any(self._missing(u) for u in wanted):
            return wanted
        folder = self.mirror.root.parent
        folder.mkdir(parents=True, exist_ok=True)
        usage = shutil.disk_usage(folder)
        plan = plan_pull(
            wanted, lambda u: sum(f.size for f in self._missing(u)), cap=self.max_pull_bytes,
            disk=Disk(str(folder), usage.free, usage.total),
        )  # fmt: skip
        notices.extend(plan.notices)
        return plan.take

    def _fetch(
        self,
        needed: Mapping[int, Mapping[str, UnitFile]],
        aborts: Mapping[int, threading.Event],
        notices: list[Notice],
    ) -> tuple[dict[int, dict[str, Path]], set[int], OrchError | None]:
        """Fetch the staged copies, node by node in parallel; (what arrived whole, by rank and
        object; ranks lost on the way; the first other failure). A node that sent more or
        other than it reported gives nothing, and a notice."""
        if not needed:
            return {}, set(), None

        def fetch(rank: int) -> dict[str, Path]:
            into = self.mirror.incoming / f"r{rank}"
            into.mkdir(parents=True, exist_ok=True)
            listing = into.parent / f"r{rank}.list"  # NUL-separated: rsync --from0
            listing.write_text("".join(f"{name}\0" for name in needed[rank]))
            argv = pull_argv(
                self.cluster.addresses[rank], self.cluster.identity, self.layout.objects, into,
                files_from=listing,
            )  # fmt: skip
            reported = sum(f.size for f in needed[rank].values())
            # 23/24: a listed copy vanished (the agent replaced it by a newer one meanwhile):
            # the checkpoints it belongs to wait for the next collection.
            with _Bounded(into, reported, aborts.get(rank)) as bounded:
                try:
                    run_rsync(
                        argv, what=f"checkpoint pull from node {rank}", timeout=self.timeout_s,
                        ok_codes=(0, 23, 24), abort=bounded.cut,
                    )  # fmt: skip
                except NodeUnreachable:
                    if not bounded.over.is_set():
                        raise
            if bounded.over.is_set() or _bytes_under(into) > reported:
                notices.append(_overrun(rank, reported))
                return {}
            return self._arrived(rank, into, needed[rank], notices)

        fetched: dict[int, dict[str, Path]] = {}
        lost: set[int] = set()
        error: OrchError | None = None
        with ThreadPoolExecutor(max_workers=max(1, len(needed))) as pool:
            futures = {rank: pool.submit(fetch, rank) for rank in needed}
            for rank, future in futures.items():
                try:
                    fetched[rank] = future.result()
                except NodeUnreachable:
                    lost.add(rank)
                except OrchError as exc:
                    lost.add(rank)
                    error = error or exc
        return fetched, lost, error

    @staticmethod
    def _arrived(
        rank: int, into: Path, objects: Mapping[str, UnitFile], notices: list[Notice]
    ) -> dict[str, Path]:
        """The fetched copies that are plain files of the size the node reported."""
        arrived: dict[str, Path] = {}
        for name, f in objects.items():
            path = into / name
            try:
                info = path.lstat()
            except OSError:
                continue  # vanished on the node: its checkpoint waits for the next collection
            if info.st_size == f.size and path.is_file() and not path.is_symlink():
                arrived[name] = path
            else:
                notices.append(
                    Notice(
                        f"size:{rank}:{f.path}:{f.digest}",
                        f"node {rank}: the copy of '{shown(f.path)}' that arrived holds "
                        f"{info.st_size} bytes, not the {f.size} its manifest reported; not "
                        "installed",
                    )
                )
        return arrived

    def _changed_links(
        self,
        needed: Mapping[int, Mapping[str, UnitFile]],
        fetched: Mapping[int, Mapping[str, Path]],
        lost: set[int],
    ) -> set[str]:
        """Paths whose fetched copy was a hard link to a file written since it was staged:
        what arrived may mix two versions, so it is not installed."""
        changed: set[str] = set()
        for rank, objects in needed.items():
            if rank in lost:
                continue
            linked = {
                name: f for name, f in objects.items() if f.linked and name in fetched.get(rank, {})
            }
            if not linked:
                continue
            command = (
                f"cd {home_expr(self.layout.objects)} && python3 -c {shlex.quote(STAT_OBJECTS)}"
            )
            try:
                output = (
                    self.cluster.connections[rank]
                    .run(command, stdin=" ".join(linked), timeout=60, check=False)
                    .stdout
                )
            except NodeUnreachable:
                lost.add(rank)
                continue
            seen = {}
            for line in output.splitlines():
                parts = line.split()
                if len(parts) == 4 and parts[0] in linked:
                    try:
                        seen[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
                    except ValueError:
                        continue  # not what the stat prints: the copy counts as changed
            for name, f in linked.items():
                # Size and mtime: a write moves the mtime. Not the ctime, which a rename
                # over the file (its next version saved beside it) moves too.
                if seen.get(name, (None, None, None))[:2] != (f.size, f.mtime_ns):
                    changed.add(f.path)
        return changed

    def _prune(self, manifests: Mapping[int, NodeManifest], ranks: range) -> list[str]:
        if self.mode == "none":
            return []
        held = self.mirror.units()
        newest = self.mirror.newest_directory()
        directories = [u for u in held.values() if u.kind != "file"]
        if self.mode == "latest":
            older = [u.name for u in directories if newest and u.name != newest.name]
            return self.mirror.prune(older)
        present = present_directories(manifests, ranks)
        if present is None:
            return []
        return self.mirror.prune([u.name for u in directories if u.name not in present])


def _bytes_under(folder: Path) -> int:
    """Bytes of every file under `folder` (not following links)."""
    total = 0
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _overrun(rank: int, reported: int) -> Notice:
    return Notice(
        f"overrun:{rank}",
        f"node {rank} sent more than the {size_text(reported)} its manifest reported: the "
        "transfer was cut off and nothing of it installed (job code may have rewritten the "
        "checkpoint agent's manifest)",
    )


class _Bounded:
    """While a transfer into `folder` runs: `cut` is set once the node is found gone (`gone`)
    or more than `limit` bytes have arrived (then `over` too)."""

    def __init__(self, folder: Path, limit: int, gone: threading.Event | None) -> None:
        self.folder = folder
        self.limit = limit
        self.gone = gone or threading.Event()
        self.cut = threading.Event()
        self.over = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pull-bound", daemon=True)

    def __enter__(self) -> _Bounded:
        if self.gone.is_set():
            self.cut.set()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(WATCH_S):
            if self.gone.is_set():
                self.cut.set()
                return
            if _bytes_under(self.folder) > self.limit:
                self.over.set()
                self.cut.set()
                return
