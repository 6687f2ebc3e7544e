"""A job's checkpoints over its life: the agents on its nodes, the mirror, the store, the ledger.

The runner (`orchestrator.control.run.runner`) calls:

- `prepare(cluster)` before each start: sends the checkpoint agent to every node, puts the
  newest complete checkpoint back on every node (each node downloads it from the store, or the
  mirror is pushed to it: `restoring`), then arms the agents. Returns what the run resumes
  from. Before a restart (`restart`, or after `hold_back`) the steps the nodes hold that are
  newer than that one and not whole on every node are first moved aside (`set_aside`:
  SET_ASIDE events).
- `hold_back()` after a run could not load what it resumed: no later start resumes that
  version again (this controller's life long); the one before it is resumed instead.
- `adopt(cluster)` when a new controller takes a running job over: starts again any agent
  that no longer runs (one that runs is left alone).
- `watch(...)` and `stop_watching()` while the run runs: a collection starts as soon as a
  node's agent staged something (the keeper follows every agent's events), and every
  `checkpoint.pull_every` seconds in any case. A failed collection keeps what the mirror had;
  it is recorded as a WARNING event (`orch status` shows it) and tried again with backoff.
  After `failure_limit_s` of failures in a row (and at least `failure_min` tries), the runner
  is handed a stop with the reason.
- `finish(...)` at the end of a run (teardown, salvage, a planned move): waits, at most
  `wait_s`, until the agents have staged and uploaded what the run left, then collects once
  more. Raises OrchError when that collection fails. It and `stop_watching` write the
  CHECKPOINT events of single-file versions held back (`pulled_events`).
- `node_gone(rank)`: a transfer from that node in progress is cut short.

A file an agent saw rewritten again and again with no copy taken is a WARNING event, and a
line of `orch status JOB` until a copy is taken again (`capture_alerts`).

What a node's word made the controller refuse (a path with control characters, a store key it
did not compute, a checkpoint over `checkpoint.max_pull_bytes` or with no room on the disk, a
transfer bigger than reported) is a WARNING event, once per thing refused and at most
`MAX_NOTICE_EVENTS` per job run, never a failed collection.

What is complete is written to the ledger, and what the store keeps decided, by
`orchestrator.cluster.checkpoints.records`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from orchestrator.cluster.checkpoints.capture_alerts import CaptureAlerts
from orchestrator.cluster.checkpoints.collector import (
    MANIFEST_MAX_BYTES,
    CheckpointCollector,
    Collected,
)
from orchestrator.cluster.checkpoints.kept_summary import Kept
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.records import CheckpointRecords, Newest
from orchestrator.cluster.checkpoints.restoring import push_mirror, restore_from_store
from orchestrator.cluster.checkpoints.set_aside import set_aside_newer
from orchestrator.cluster.checkpoints.store import (
    node_access,
)
from orchestrator.cluster.checkpoints.streak import PullStreak, pull_failure_reason
from orchestrator.cluster.checkpoints.units import step_of
from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.node_runtime import ensure_runtime
from orchestrator.cluster.steps import node_step
from orchestrator.config import Settings
from orchestrator.errors import OrchError, RemoteError
from orchestrator.ledger.store import Ledger
from orchestrator.node.checkpoint_protocol import (
    AgentConfig,
    AgentLayout,
    AgentReport,
    Notice,
    RestoredFile,
    StoreAccess,
    arm_command,
    folder_command,
    follow_command,
)
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.streams import LineStream
from orchestrator.spec.model import CheckpointSpec

FINISH_POLL_S = 0.2  # between two looks at the agents while waiting (one SSH command per node)
MAX_NOTICE_EVENTS = 100  # refusals written as events per keeper; then one event says so


AGENT_HINT = (
    "the agents need python3 (3.8 or newer) on the nodes' PATH and room in their home; the "
    "lines above say what failed: fix the node image (or `setup`) and submit again"
)
RESTORE_HINT = (
    "the checkpoint stays where orch keeps it (`orch status JOB` lists it); the lines above "
    "say what failed (a full disk, a store the nodes cannot reach): fix it and submit again, "
    "and the new run resumes from it"
)


@dataclass(frozen=True)
class KeeperOptions:
    """Timing of checkpoint collection (seconds)."""

    pull_every: float = 60.0  # between collections when no agent reports anything new
    backoff_first_s: float = 5.0  # wait before the first retry of a failed collection
    backoff_cap_s: float = 120.0  # longest wait between retries
    failure_limit_s: float = 600.0  # failures in a row for this long fail the job ...
    failure_min: int = 5  # ... once there were at least this many
    transfer_timeout_s: float = 3600.0  # one node's transfer, at most
    restore_timeout_s: float = 3600.0  # every node's download from the store, at most
    push_timeout_s: float = 3600.0  # putting the mirror back on a node, at most


OVERSIZED_MANIFEST = (
    f"its manifest is longer than {MANIFEST_MAX_BYTES // 2**20} MiB and was not read; this "
    "node's checkpoints wait until it is shorter"
)


@dataclass(frozen=True)
class Resume:
    """What a start resumes from: the node path of the newest complete directory
    checkpoint ("" when there is none), its step, and its name under the checkpoint
    directory (None when there is none)."""

    path: str
    step: int | None
    name: str | None = None


class CheckpointKeeper:
    """See the module docstring. Built with no I/O; bound to a cluster by `prepare`/`adopt`."""

    def __init__(
        self,
        *,
        job_id: str,
        checkpoint: CheckpointSpec,
        node_dir: str,
        mirror: CheckpointMirror,
        ledger: Ledger,
        settings: Settings,
        line: Callable[[str], None],
        options: KeeperOptions | None = None,
        node_owner: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.node_owner = node_owner or job_id  # whose directories the nodes hold
        self.spec = checkpoint
        self.node_dir = node_dir
        self.mirror = mirror
        self.ledger = ledger
        self.settings = settings
        self.line = line
        self.options = options or KeeperOptions(pull_every=checkpoint.pull_every)
        self.layout = AgentLayout(self.node_owner)
        self.streak = PullStreak()
        self._collector: CheckpointCollector | None = None
        self._access: StoreAccess | None = None
        self._aborts: dict[int, threading.Event] = {}
        self.records = CheckpointRecords(
            job_id=job_id, store=checkpoint.store, mirror=mirror, ledger=ledger,
            settings=settings, line=line,
        )  # fmt: skip
        self._noticed: set[str] = set()
        self._resumed: tuple[str, str] | None = None  # (name, version) the last start resumed
        self._held_back: set[tuple[str, str]] = set()  # versions no start resumes again
        self.alerts = CaptureAlerts(lambda kind, text: ledger.add_event(job_id, kind, text))
        self._streams: list[LineStream] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()

    # --- binding to a cluster ---------------------------------------------------------------
    def _bind(self, cluster: Cluster, *, nodes_have_credentials: bool, region: str | None) -> None:
        self._collector = CheckpointCollector(
            cluster, self.mirror, self.layout, mode=self.spec.mirror_mode,
            timeout_s=self.options.transfer_timeout_s,
            max_pull_bytes=self.settings.checkpoint.max_pull_bytes, keys=self.records.keys,
        )  # fmt: skip
        self._aborts = {rank: threading.Event() for rank in range(len(cluster.instances))}
        self._access = None
        self.records.region = region
        if self.spec.store is not None:
            self._access = node_access(
                self.spec.store, self.settings,
                nodes_have_credentials=nodes_have_credentials, region=region,
            )  # fmt: skip

    @property
    def collector(self) -> CheckpointCollector:
        if self._collector is None:
            raise RuntimeError("the keeper is not bound to a cluster: prepare or adopt first")
        return self._collector

    def prepare(
        self,
        cluster: Cluster,
        *,
        nodes_have_credentials: bool = False,
        region: str | None = None,
        restart: bool = False,
    ) -> Resume:
        """Before a start: agents sent, the newest checkpoint put back, newer steps the nodes
        hold set aside (with `restart`, or once a version was held back), agents armed."""
        self._bind(cluster, nodes_have_credentials=nodes_have_credentials, region=region)
        with node_step("sending the checkpoint agents to the nodes", AGENT_HINT):
            self._install(cluster)
        with node_step("putting the newest checkpoint back on the nodes", RESTORE_HINT):
            restored, resume = self._put_back(cluster)
        if restart or self._held_back:
            self._set_aside(cluster, resume)
        with node_step("arming the checkpoint agents", AGENT_HINT):
            self._arm(cluster, restored)
        return resume

    def hold_back(self) -> Newest | None:
        """The checkpoint the last start resumed is not resumed again (a run could not load
        it); returns it, or None when that start resumed none. `newest()` and later starts
        skip it; it stays where it is kept."""
        if self._resumed is None:
            return None
        self._held_back.add(self._resumed)
        name, _version = self._resumed
        self._resumed = None
        return Newest(name, step_of(name))

    def _set_aside(self, cluster: Cluster, resume: Resume) -> None:
        """Move aside, on every node, the steps newer than `resume` that are not whole on
        every node; each node's moves are a SET_ASIDE event (a WARNING for what failed)."""
        try:
            done = set_aside_newer(
                cluster, owner=self.node_owner, checkpoint_dir=self.node_dir,
                resume=resume.name, held_back=[name for name, _v in self._held_back],
            )  # fmt: skip
        except OrchError as exc:
            self.ledger.add_event(
                self.job_id, "WARNING", f"newer checkpoints the nodes hold were not set "
                f"aside: {exc}; a script that resumes the newest step it finds may find one",
            )  # fmt: skip
            return
        self.records.set_aside.update(e for m in done.moved.values() for e in m.moved)
        for kind, message in done.events(resume.name):
            self.ledger.add_event(self.job_id, kind, message, step=resume.step)

    def adopt(
        self, cluster: Cluster, *, nodes_have_credentials: bool = False, region: str | None = None
    ) -> None:
        """A new controller took the job over: start any agent that is not running."""
        self._bind(cluster, nodes_have_credentials=nodes_have_credentials, region=region)
        self._install(cluster)
        self._arm(cluster, {})

    def newest(self) -> Newest | None:
        """The newest complete directory checkpoint kept anywhere (the mirror or the store),
        but one held back (`hold_back`)."""
        return self.records.newest(skip=self._held_back)

    def kept(self) -> list[Kept]:
        """The newest directory checkpoint and the newest version of every single file kept,
        but a version held back (`hold_back`); see `kept_summary`."""
        return self.records.kept(skip=self._held_back)

    def sweep_store(self) -> None:
        """At the job's end: delete what the job left in the store that no kept version uses."""
        self.records.sweep_store()

    def node_gone(self, rank: int) -> None:
        event = self._aborts.get(rank)
        if event is not None:
            event.set()

    def _install(self, cluster: Cluster) -> None:
        folder = folder_command(self.layout)
        cluster.map(lambda rank, c: ensure_runtime(c, before=folder))

    def _arm(
        self,
        cluster: Cluster,
        restored: dict[str, RestoredFile],
        ranks: Collection[int] | None = None,
    ) -> None:
        wanted = set(range(len(cluster.instances)) if ranks is None else ranks)

        def arm(rank: int, connection: NodeConnection) -> None:
            if rank not in wanted:
                return
            config = AgentConfig(
                self.job_id, rank, self.node_dir, store=self._access, restored=restored,
                node_owner=self.node_owner,
            )  # fmt: skip
            connection.run(
                arm_command(self.layout), stdin=json.dumps(config.document()), timeout=30
            )

        cluster.map(arm)

    # --- putting checkpoints back -----------------------------------------------------------
    def _put_back(self, cluster: Cluster) -> tuple[dict[str, RestoredFile], Resume]:
        skip = self._held_back
        from_store = self.records.store_plan(skip=skip) if self._access is not None else None
        newest_held = self.mirror.newest_directory(skip=skip)
        self._resumed = None
        if from_store is not None:
            items, name, step = from_store.items, from_store.name, from_store.step
            mirror_is_newer = (
                newest_held is not None
                and newest_held.step is not None
                and (step is None or newest_held.step > step)
            )
            if not mirror_is_newer:
                try:
                    assert self._access is not None
                    restore_from_store(
                        cluster, items, node_dir=self.node_dir, access=self._access,
                        layout=self.layout, timeout_s=self.options.restore_timeout_s,
                        ledger=self.ledger, job_id=self.job_id,
                    )  # fmt: skip
                    restored = {i.path: RestoredFile(i.digest, i.size, i.key) for i in items}
                    if name is not None and from_store.version is not None:
                        self._resumed = (name, from_store.version)
                    return restored, self._resume(name, step)
                except RemoteError as exc:
                    if not self.mirror.files():
                        raise
                    self.ledger.add_event(
                        self.job_id, "WARNING",
                        f"restore from the store failed, pushing the mirror instead: {exc}",
                    )  # fmt: skip
        held = self.mirror.files()
        if not held:
            return {}, Resume("", None)
        push_mirror(
            cluster, self.mirror, node_dir=self.node_dir,
            timeout_s=self.options.push_timeout_s, ledger=self.ledger, job_id=self.job_id,
        )  # fmt: skip
        restored = {path: RestoredFile(sha, size) for path, (sha, size) in held.items()}
        if newest_held is None:
            return restored, Resume("", None)
        self._resumed = (newest_held.name, newest_held.version)
        return restored, self._resume(newest_held.name, newest_held.step)

    def _resume(self, name: str | None, step: int | None) -> Resume:
        if name is None:
            return Resume("", None)
        path = self.node_dir if name == "." else f"{self.node_dir}/{name}"
        return Resume(path, step, name)

    # --- collecting while the run runs -------------------------------------------------------
    def watch(
        self,
        cluster: Cluster,
        *,
        gone: Callable[[], Collection[int]],
        on_failure: Callable[[str], None],
    ) -> None:
        """Collect whenever an agent reports news, and every `pull_every` seconds. Failed
        collections are retried with backoff; once they have failed for long enough (or on an
        unexpected error) `on_failure` gets the reason the job must fail, and watching ends."""
        self._stop.clear()
        self._wake.clear()
        self._streams = [
            LineStream(
                connection,
                follow_command(self.layout),
                lambda _line: self._wake.set(),
                name=f"checkpoints {rank}",
            )  # fmt: skip
            for rank, connection in enumerate(cluster.connections)
        ]
        for stream in self._streams:
            stream.start()
        self._thread = threading.Thread(
            target=self._loop, args=(gone, on_failure), name="checkpoint-collector", daemon=True
        )
        self._thread.start()

    def stop_watching(self) -> None:
        """Stop following the agents; a collection in progress finishes first."""
        self._stop.set()
        self._wake.set()
        for stream in self._streams:
            stream.stop(wait_s=0)
        for stream in self._streams:
            stream.stop(wait_s=0.5)
        self._streams = []
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.records.flush_events()

    def _loop(self, gone: Callable[[], Collection[int]], on_failure: Callable[[str], None]) -> None:
        next_at = time.monotonic() + self.options.pull_every
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_at - time.monotonic()))
            if self._stop.is_set():
                return
            now = time.monotonic()
            if self.streak.failures and now < next_at:
                self._stop.wait(next_at - now)  # backing off: news waits too
                continue
            self._wake.clear()
            try:
                self.collect(skip=gone())
            except OrchError as exc:
                reason = self._failed(exc)
                if reason is not None:
                    on_failure(reason)
                    return
                next_at = time.monotonic() + self.streak.retry_in(
                    self.options.backoff_first_s, self.options.backoff_cap_s
                )
                continue
            except Exception as exc:  # noqa: BLE001 - handed to the runner, which ends the job
                on_failure(f"internal error: {exc!r}")
                return
            next_at = time.monotonic() + self.options.pull_every

    def _failed(self, exc: OrchError) -> str | None:
        now = time.monotonic()
        self.streak.failed(now, exc.message)
        wait = self.streak.retry_in(self.options.backoff_first_s, self.options.backoff_cap_s)
        self.ledger.add_event(
            self.job_id, "WARNING", f"checkpoint pull failed ({self.streak.failures} in a "
            f"row; the mirror keeps what it had); next try in {wait:.0f} s: {exc.message}",
        )  # fmt: skip
        return pull_failure_reason(
            self.streak, now=now, limit_s=self.options.failure_limit_s,
            min_failures=self.options.failure_min,
        )  # fmt: skip

    def finish(self, *, skip: Collection[int] = (), wait_s: float = 60.0) -> Collected:
        """The run ended (or was stopped): wait until the agents are done (at most `wait_s`),
        then collect once more."""
        deadline = time.monotonic() + wait_s
        rearmed = False
        while True:
            reports = self.collector.read(skip)
            dead = [r for r, rep in reports.items() if _dead_unfinished(rep)]
            if dead and not rearmed:
                self._arm(self.collector.cluster, {}, ranks=dead)
                rearmed = True
            if all(_finished(rep) for rep in reports.values()):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(FINISH_POLL_S)
        collected = self.collect(skip=skip)
        self.records.flush_events()
        return collected

    def collect(self, *, skip: Collection[int] = ()) -> Collected:
        """One collection, recorded in the ledger; raises OrchError when it failed."""
        collected = self.collector.collect(skip=skip, aborts=self._aborts)
        self.streak.succeeded()
        self._note_problems(collected.reports)
        self._note(collected.notices)
        self.alerts.update(collected.reports)
        dead = [r for r, rep in collected.reports.items() if _dead_unfinished(rep)]
        if dead:
            self._arm(self.collector.cluster, {}, ranks=dead)
        self.records.record(collected, range(len(self.collector.cluster.instances)))
        return collected

    def _note_problems(self, reports: dict[int, AgentReport]) -> None:
        notices = []
        for rank in sorted(self.collector.oversized):
            text = f"node {rank}: checkpoint agent: {OVERSIZED_MANIFEST}"
            notices.append(Notice(text, text))
        for rank, report in sorted(reports.items()):
            manifest = report.manifest
            for problem in manifest.problems if manifest else ():
                text = f"node {rank}: checkpoint agent: {problem}"
                notices.append(Notice(text, text))
            notices.extend(manifest.refused if manifest else ())
        self._note(notices)

    def _note(self, notices: list[Notice]) -> None:
        """Each notice as a WARNING event, once per `about`, at most MAX_NOTICE_EVENTS."""
        for notice in notices:
            if notice.about in self._noticed or len(self._noticed) > MAX_NOTICE_EVENTS:
                continue
            self._noticed.add(notice.about)
            message = notice.message
            if len(self._noticed) > MAX_NOTICE_EVENTS:
                message = (
                    f"more than {MAX_NOTICE_EVENTS} checkpoint refusals; further ones are not "
                    "recorded until the job's controller restarts"
                )
            self.ledger.add_event(self.job_id, "WARNING", message)


def _finished(report: AgentReport) -> bool:
    """The agent has nothing more to stage: it is done, or not running (and not coming back)."""
    if report.agent != "alive":
        return report.manifest is None or report.manifest.done or report.agent == "none"
    return report.manifest is not None and report.manifest.done


def _dead_unfinished(report: AgentReport) -> bool:
    return report.agent == "dead" and (report.manifest is None or not report.manifest.done)
