"""One look at a running job: is every node alive, what did they print, what did rank 0 say.

`RunWatch.tick()` probes every node over its open connection (one command each), appends new
log bytes to `ORCH_HOME/jobs/<id>/logs/node-<rank>.log` (so `orch logs -f` works from any
terminal while the job runs; capped and rotated, see `orchestrator.cluster.log_files`), reports
rank 0's progress, and returns the verdict; `RunWatch.peek()` pulls rank 0's log alone, for a
person waiting on a run's first lines between two ticks. A node that fails `lost_after` probes
in a row is lost (`NodeLost`): one missed probe is not enough.

What a node prints is mirrored byte for byte (the offsets count the node's bytes, whatever
its encoding), and read in bounded pieces: a probe returns at most `launch.PROBE_LOG_LIMIT`
bytes of log, and rank 0's lines are cut at `remote.lines.DEFAULT_MAX_LINE`, so a run that
prints a line without end costs the controller a bounded buffer and is still watched.

A check never waits longer than `probe_timeout` for a node: a node that has not answered by
then missed the check, and its probe may go on (a dead link can hold a command or a reconnect
for much longer) while later checks count as missed, without a second probe to that node. So a
node cut off from the network is confirmed lost after about `lost_after` x (`probe_timeout` +
the watch interval), and a shorter outage costs a missed check or two.

A node whose probe is late (no answer after `suspect_after`, or a probe still out from an
earlier check) is put to `confirm_gone` (the provider: was it taken?) at once and then every
`CONFIRM_EVERY_S` while the check waits; a yes ends the wait, the node missing this check. So
a node the provider took is found within `suspect_after` (plus a second) of the first check
that asks it, not a whole `probe_timeout` later, whatever else the controller does meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cluster import log_files
from orchestrator.cluster.connections import Cluster
from orchestrator.errors import NodeLost, NodeUnreachable
from orchestrator.node import launch
from orchestrator.node.progress import Metrics, ProgressReader, describe_event, local_rank_line
from orchestrator.node.run_progress import LAUNCH_MARK, ProgressClock
from orchestrator.remote.lines import Line, LineSplitter
from orchestrator.remote.ssh import CommandResult, NodeConnection

UNANSWERED = launch.NodeProbe("unreachable", None, 0, "")
PROBE_COMMAND_TIMEOUT = 30.0  # a probe still running after this gives up (checks go on missing)
PEEK_TIMEOUT = 5.0  # a peek gives up sooner: it is only early news, the next tick reads it all
SUSPECT_AFTER_S = 1.5  # a probe unanswered this long is late: is its node gone? (see above)
CONFIRM_EVERY_S = 1.0  # how often a late node is put to `confirm_gone` while a check waits
# A probe prints one status line, then at most PROBE_LOG_LIMIT bytes of log: more is garbage.
PROBE_MAX_OUTPUT = launch.PROBE_LOG_LIMIT + 64 * 1024
COPIED_TAIL_BYTES = 256 * 1024  # how far back an adopting controller looks for rank 0's step


@dataclass(frozen=True)
class Answer:
    """One node's answer to a probe: the parsed probe, and its new log bytes as the node holds
    them (the log is mirrored byte for byte, whatever encoding the run prints in)."""

    probe: launch.NodeProbe
    log: bytes = b""


NO_ANSWER = Answer(UNANSWERED)


@dataclass(frozen=True)
class Verdict:
    """What the probes of one tick say about the run."""

    done: bool
    failed_rank: int | None = None
    exit_code: int | None = None


def assess(states: list[launch.NodeProbe]) -> Verdict:
    """Finished when every node exited 0; failed as soon as one node exited non-zero."""
    for rank, probe in enumerate(states):
        if probe.state == "exited" and probe.exit_code != 0:
            return Verdict(True, rank, probe.exit_code)
    if all(p.state == "exited" for p in states):
        return Verdict(True)
    return Verdict(False)


def peek_command(layout: launch.NodeLayout, log_offset: int) -> str:
    """Shell command printing the node's log from byte `log_offset` (at most
    `launch.PROBE_LOG_LIMIT` bytes; nothing while there is no log)."""
    log = launch.home_expr(layout.log)
    return f"tail -c +{int(log_offset) + 1} {log} 2>/dev/null | head -c {launch.PROBE_LOG_LIMIT}"


class RunWatch:
    """Watches the detached run of one job on its cluster. Resumable: log offsets continue
    from the local copies, so an adopting controller neither repeats nor skips log lines.

    `on_metrics(metrics, read_at)` gets each progress line of rank 0 with the time
    (`time.monotonic()`) of the check that read it: every line of one check has the same. Its
    step lines (JSON, or those `progress_pattern` matches) each; the progress read from the
    output's shape (`node.progress_shapes`: progress bars redrawn many times a second), the
    last of each check. Rank 0's lines end at a carriage return too (a bar's redraw)."""

    def __init__(
        self,
        cluster: Cluster,
        layout: launch.NodeLayout,
        logs_dir: Path,
        *,
        on_metrics: Callable[[Metrics, float], None],
        on_line: Callable[[str], None],
        lost_after: int = 3,
        probe_timeout: float = 30.0,
        max_log_bytes: int = 0,
        log_keep: int = 3,
        unprefixed_is_rank0: bool = False,
        confirm_gone: Callable[[list[int]], bool] | None = None,
        suspect_after: float = SUSPECT_AFTER_S,
        progress_pattern: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.layout = layout
        self.logs_dir = logs_dir
        self.on_metrics = on_metrics
        self.on_line = on_line
        self.lost_after = lost_after
        self.probe_timeout = probe_timeout
        self.max_log_bytes = max_log_bytes  # cap per log file, 0: none (see log_files)
        self.log_keep = log_keep  # rotated files kept per log
        # `launcher: none`: the run's own output on node 0 has no torchrun prefix; it is read as
        # rank 0's (a launcher of its own that tees with prefixes still works as usual).
        self.unprefixed_is_rank0 = unprefixed_is_rank0
        # Whether any of the given (late) ranks is known gone, by the provider's word.
        self.confirm_gone = confirm_gone
        self.suspect_after = suspect_after
        logs_dir.mkdir(parents=True, exist_ok=True)
        count = len(cluster.instances)
        self.paths = [logs_dir / f"node-{rank}.log" for rank in range(count)]
        self.offsets = [
            self._remote_offset(path, instance.instance_id)
            for path, instance in zip(self.paths, cluster.instances, strict=True)
        ]
        self.misses = [0] * count
        self.progress_seen = False  # a progress line of rank 0 was read (and reported)
        # Rank 0's progress as this watch reads it (`run_progress`), on time.monotonic(); the
        # supervisor puts in the clock of the run it watches.
        self.clock = ProgressClock(time.monotonic(), starting=False)
        # rank 0's lines: a line that never ends is cut
        self._rank0 = LineSplitter(split_cr=True)
        self._progress = ProgressReader(progress_pattern)  # the job's `progress.pattern`
        # Its own threads: a probe stuck on a dead link must not hold up the cluster's pool.
        self._pool = ThreadPoolExecutor(max_workers=max(1, count), thread_name_prefix="probe")
        self._pending: list[Future[Answer] | None] = [None] * count

    def tick(self) -> Verdict:
        answers = self._probe_all()
        probes = [answer.probe for answer in answers]
        read_at = time.monotonic()
        for rank, answer in enumerate(answers):
            if answer.log:
                self._append(rank, answer.log)
                if rank == 0:
                    self._show(self._rank0.feed(answer.log), read_at)
            probe = answer.probe
            lost = probe.state in ("unreachable", "vanished", "not-started")
            self.misses[rank] = self.misses[rank] + 1 if lost else 0
            if self.misses[rank] >= self.lost_after:
                instance = self.cluster.instances[rank]
                raise NodeLost(
                    rank,
                    f"node {rank} ({instance.instance_id}) was lost: {probe.state} on "
                    f"{self.misses[rank]} consecutive checks",
                    hint=f"see `orch logs {self.layout.job_id} --node {rank}`",
                )
        verdict = assess(probes)
        if verdict.done:
            self._show(self._rank0.flush(), read_at)
        return verdict

    def peek(self) -> None:
        """Pull rank 0's new log bytes and report its lines as `tick` does, asking no other
        node and judging nothing: no verdict, no miss counted (a rank 0 that does not answer
        is the next tick's to judge). A lighter command than a probe (it reads the log and
        nothing else) that waits at most `PEEK_TIMEOUT`; none while a probe of rank 0 is
        still out (the log's offset moves in order) or its connection is down (reconnecting
        is the ticks'). Never at the same time as a tick or another peek: the watch is not
        thread-safe."""
        connection = self.cluster.connections[0]
        if self._pending[0] is not None or not connection.is_alive():
            return
        command = peek_command(self.layout, self.offsets[0])
        timeout = min(self.probe_timeout, PEEK_TIMEOUT)
        try:
            result = connection.run(
                command, timeout=timeout, check=False, max_output=launch.PROBE_LOG_LIMIT
            )
        except NodeUnreachable:
            return
        if result.stdout_bytes:
            self._append(0, result.stdout_bytes)
            self._show(self._rank0.feed(result.stdout_bytes), time.monotonic())

    def catch_up(self, *, skip: Collection[int] = ()) -> None:
        """Copy the log bytes the nodes printed since the last tick; nodes that do not
        answer, and the ranks in `skip`, are skipped. For the end of a run, when no verdict
        is wanted any more."""
        for _ in range(16):  # a probe returns at most 1 MiB of log
            answers = self._probe_all(skip=skip)
            for rank, answer in enumerate(answers):
                if answer.log:
                    self._append(rank, answer.log)
            if all(len(answer.log) < launch.PROBE_LOG_LIMIT for answer in answers):
                return

    def _probe_all(self, *, skip: Collection[int] = ()) -> list[Answer]:
        """One answer per node, by rank, within `probe_timeout`; `NO_ANSWER` for a node whose
        probe (started now, or still running from an earlier check) has not answered by then,
        and at once for the ranks in `skip` (nodes found gone: asking would cost a timeout).

        A node never has two probes at once, so its log offset moves in order. Errors other
        than an unreachable node are raised once every answer that came is taken in.
        """
        skipped = set(skip)
        late = {r for r, f in enumerate(self._pending) if f is not None and r not in skipped}
        for rank, connection in enumerate(self.cluster.connections):
            if self._pending[rank] is None and rank not in skipped:
                self._pending[rank] = self._pool.submit(self._probe, rank, connection)
        asked = [f for r, f in enumerate(self._pending) if f is not None and r not in skipped]
        self._wait(asked, late, skipped)
        answers: list[Answer] = []
        error: BaseException | None = None
        for rank, future in enumerate(self._pending):
            if rank in skipped or future is None or not future.done():
                answers.append(NO_ANSWER)
                continue
            self._pending[rank] = None
            try:
                answers.append(future.result())
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others
                answers.append(NO_ANSWER)
                error = error or exc
        if error is not None:
            raise error
        return answers

    def _wait(self, asked: list[Future[Answer]], late: set[int], skipped: set[int]) -> None:
        """Wait up to `probe_timeout` for the probes `asked`; sooner once `confirm_gone` says a
        late node (`late`: probes out from earlier checks) is gone (see the module docstring)."""
        deadline = time.monotonic() + self.probe_timeout
        if self.confirm_gone is None:
            wait(asked, timeout=self.probe_timeout)
            return
        if not late:
            wait(asked, timeout=min(self.suspect_after, self.probe_timeout))
        while (left := deadline - time.monotonic()) > 0:
            unanswered = [
                rank
                for rank, future in enumerate(self._pending)
                if future is not None and rank not in skipped and not future.done()
            ]
            if not unanswered or self.confirm_gone(unanswered):
                return
            wait(asked, timeout=min(CONFIRM_EVERY_S, left))

    def _append(self, rank: int, data: bytes) -> None:
        log_files.append(
            self.paths[rank],
            data,
            max_bytes=self.max_log_bytes,
            keep=self.log_keep,
            pulled_at=datetime.now(UTC),
        )
        self.offsets[rank] += len(data)

    def _remote_offset(self, path: Path, instance_id: str) -> int:
        """How much of the node's log the local copy already holds.

        A local log may hold the logs of earlier nodes of the same rank (replaced after a
        spot reclaim) before this node's; where this node's part starts is kept in
        `.starts/<instance id>`, written when the node is first watched.
        """
        size = log_files.logical_size(path)  # rotated parts count too
        start_file = self.logs_dir / ".starts" / instance_id
        try:
            start = int(start_file.read_text())
        except (OSError, ValueError):
            start_file.parent.mkdir(parents=True, exist_ok=True)
            start_file.write_text(str(size))
            start = size
        return max(0, size - start)

    def _probe(self, rank: int, connection: NodeConnection) -> Answer:
        command = launch.probe_command(self.layout, self.offsets[rank])
        try:
            result = connection.run(
                command, timeout=PROBE_COMMAND_TIMEOUT, check=False, max_output=PROBE_MAX_OUTPUT
            )
        except NodeUnreachable:
            return NO_ANSWER
        return probe_answer(result)

    def _show(self, lines: list[Line], read_at: float) -> None:
        shaped: Metrics | None = None  # the last progress read from the output's shape
        for line in lines:
            if line.text.startswith(LAUNCH_MARK):
                self.clock.launch_line(line.text, read_at)
                self.on_line(line.text)
                continue
            text = rank0_text(line.text, unprefixed_is_rank0=self.unprefixed_is_rank0)
            if text is None:
                continue
            metrics = self._progress.read(text)
            if metrics is None or not metrics.step_line:
                if metrics is not None:  # a step read from the output's shape (no step line)
                    # Its lines are its progress, whatever an earlier run's step (one of
                    # these, in the ledger) made the clock take it for.
                    self.clock.steps = False
                    self.progress_seen, shaped = True, metrics
                self.clock.saw(None, read_at)
                self.on_line(describe_event(text) or text)
                continue
            self.clock.saw(metrics.step, read_at)
            if self._progress.pattern is not None:
                self.on_line(text)  # the job's own line; JSON step lines are not shown
            self.progress_seen = True
            self.on_metrics(metrics, read_at)
        if shaped is not None:
            self.on_metrics(shaped, read_at)


def rank0_text(text: str, *, unprefixed_is_rank0: bool) -> str | None:
    """A log line's text when rank 0 printed it (torchrun's prefix taken off), else None; a
    launch line is none of the run's. `unprefixed_is_rank0`: see `RunWatch`."""
    local_rank, text = local_rank_line(text)
    if local_rank is None:
        if text.startswith(LAUNCH_MARK) or not unprefixed_is_rank0:
            return None
        local_rank = 0
    return text if local_rank == 0 else None


def copied_progress(
    logs_dir: Path,
    instance_id: str,
    *,
    progress_pattern: str | None = None,
    unprefixed_is_rank0: bool = False,
    limit: int = COPIED_TAIL_BYTES,
) -> Metrics | None:
    """The newest progress of rank 0 in the local copy of the log of `instance_id` (rank 0's
    node) under `logs_dir`, read from its last `limit` bytes; None when the copy holds nothing
    of that node. For a controller adopting a run: the one that died may have read steps it
    had not yet written to the ledger (a job's step is written every 2 s), and the adopting
    watch goes on after those lines, never reading them again. Reads only."""
    path = logs_dir / "node-0.log"
    try:
        start = int((logs_dir / ".starts" / instance_id).read_text())  # see `RunWatch`
    except (OSError, ValueError):
        return None
    end = log_files.logical_size(path)
    if end <= start:
        return None
    first = max(start, end - limit)
    _, data = log_files.read_from(path, first)
    if first > start:  # cut inside this node's part: its first line may be a piece
        data = data.partition(b"\n")[2]
    splitter = LineSplitter(split_cr=True)
    reader = ProgressReader(progress_pattern)
    newest: Metrics | None = None
    for line in [*splitter.feed(data), *splitter.flush()]:
        text = rank0_text(line.text, unprefixed_is_rank0=unprefixed_is_rank0)
        newest = (reader.read(text) if text is not None else None) or newest
    return newest


def probe_answer(result: CommandResult) -> Answer:
    """A probe's result as an answer. Output past `PROBE_MAX_OUTPUT` (a status line no run
    writes) reads as an unreadable probe: `vanished`, which the next checks confirm or not."""
    if result.cut:
        return Answer(launch.parse_probe(""))
    probe = launch.parse_probe(result.stdout)
    return Answer(probe, result.stdout_bytes.partition(b"\n")[2] if probe.new_log else b"")
