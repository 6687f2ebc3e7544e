"""Watch a node's GPUs (nvidia-smi) or, on GPU-less nodes, its job's CPU use, over SSH.

`GpuWatcher` keeps ONE long-running `nvidia-smi -l N` per node, on a channel of the node's
existing SSH connection, and a thread that keeps the latest reading of every GPU. Nothing is
started per poll: `latest()` only reads memory. `CpuWatcher` is the fallback for nodes
without nvidia-smi: one short command per call on the same connection.

Neither raises on a node's misbehaviour: a missing or failing nvidia-smi, garbage, a hang or
a lost connection turn readings into *unknown* (which `orchestrator.node.gpu.IdlePolicy` never
counts as idle) and are described in `error`.
"""

from __future__ import annotations

import collections
import shlex
import threading
import time
from collections.abc import Callable

from orchestrator.errors import OrchError, StreamStalled
from orchestrator.node.gpu import (
    CpuReading,
    GpuSample,
    NodeGpuState,
    cpu_percent,
    cpu_ticks_command,
    nvidia_smi_argv,
    parse_cpu_ticks,
    parse_line,
)
from orchestrator.node.launch import NodeLayout, home_expr
from orchestrator.remote.ssh import NodeConnection
from orchestrator.remote.streams import CommandLines

__all__ = ["CpuWatcher", "GpuWatcher", "NodeGpuState"]

MAX_LINE = 64 * 1024  # a longer "line" is garbage and is cut
CPU_MAX_OUTPUT = 64 * 1024  # a CPU reading is a line of numbers: more is garbage, not read
HANG_FLOOR_S = 10.0  # nvidia-smi silent this long (or 3 intervals, if longer) is hung


class GpuWatcher:
    """The latest nvidia-smi readings of one node, from one long-lived command.

    Lifecycle: build (no I/O) -> `start()` -> `latest()` as often as wanted -> `stop()`.

    `start()` returns at once; a daemon thread runs `nvidia_smi_argv(interval_s)` with
    `connection.stream` (one channel of the node's persistent SSH connection; it connects if
    the connection was not opened yet, never opens a second one) with a pseudo-terminal, so
    that closing the channel hangs up nvidia-smi even when it is stuck (a server that refuses
    ptys gets a plain channel; a stuck nvidia-smi may then outlive it). Each record line updates
    its GPU's sample.

    Failures, all reported through `latest()` and never raised:
    - garbage output: every GPU of the node becomes unknown until its next good record;
    - a GPU without a record for `stale_after_s` (default 3 intervals) is unknown;
    - nvidia-smi exits (any status) or prints nothing for `hang_after_s` (default
      max(3 intervals, 10 s)): the channel is closed, every GPU is unknown, and the command is
      started again, at most once per `restart_every_s` (default 30 s);
    - nvidia-smi missing (exit 127, or "nvidia-smi: ... not found") or "No devices were
      found": `available` becomes False (use `CpuWatcher` for the node); the watcher keeps
      retrying at the same pace in case it appears;
    - the SSH connection is down: after the first start the watcher does not reconnect by
      itself; it waits until the connection is alive again (the controller's own commands
      reconnect it) and restarts the command then.

    Readings are stamped with `now()` (default `time.monotonic`); pass the same clock to
    `latest`. The restart pace and hang detection always use `time.monotonic`. `wait_answer`
    waits for nvidia-smi's first word (a record, its exit, or a failure to start or read it;
    not a line of garbage, which a missing nvidia-smi's shell prints before its exit), so that
    a first look right after `start()` is not a look at nothing. Thread-safe.

    `gpu_indices`: the machine's GPUs this node may use (an allocation on a shared machine);
    records of any other GPU are ignored, so another job's GPUs never count for this one.
    None: every GPU of the machine.
    """

    def __init__(
        self,
        connection: NodeConnection,
        interval_s: int,
        *,
        now: Callable[[], float] = time.monotonic,
        restart_every_s: float = 30.0,
        stale_after_s: float | None = None,
        hang_after_s: float | None = None,
        join_timeout_s: float = 5.0,
        gpu_indices: tuple[int, ...] | None = None,
    ) -> None:
        self.connection = connection
        self.gpu_indices = gpu_indices
        self.interval_s = interval_s
        self.command = shlex.join(nvidia_smi_argv(interval_s))  # validates interval_s
        self.restart_every_s = restart_every_s
        self.stale_after_s = 3.0 * interval_s if stale_after_s is None else stale_after_s
        self.hang_after_s = (
            max(3.0 * interval_s, HANG_FLOOR_S) if hang_after_s is None else hang_after_s
        )
        self.join_timeout_s = join_timeout_s
        self._now = now
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lines: CommandLines | None = None
        self._samples: dict[int, tuple[GpuSample, float]] = {}
        self._available: bool | None = None
        self._error: str | None = None
        self._updated_at: float | None = None
        self._starts = 0
        self._answered = threading.Event()  # nvidia-smi said something, or could not be run

    # --- public ---------------------------------------------------------------------------------

    @property
    def starts(self) -> int:
        """How many times nvidia-smi was started on the node so far."""
        with self._lock:
            return self._starts

    @property
    def running(self) -> bool:
        """True while the watcher's thread runs (from `start()` until `stop()`)."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start watching in a daemon thread; returns at once. A no-op while already running."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            name = f"gpu-watch {self.connection.address.name}"
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def wait_answer(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the node's first answer since `start()`; whether it came."""
        return self._answered.wait(max(0.0, timeout_s))

    def latest(self, now: float | None = None) -> NodeGpuState:
        """The node's current readings; GPUs without a record in `stale_after_s` are unknown."""
        t = self._now() if now is None else now
        with self._lock:
            samples = tuple(
                sample if t - at <= self.stale_after_s else GpuSample.unknown(index, sample.uuid)
                for index, (sample, at) in sorted(self._samples.items())
            )
            return NodeGpuState(self._available, samples, self._error, self._updated_at)

    def stop(self) -> None:
        """Close the channel (which hangs up nvidia-smi on the node) and join the thread.

        Waits at most `join_timeout_s` for the thread; the SSH connection stays open.
        Idempotent.
        """
        self._stop.set()
        with self._lock:
            lines, thread = self._lines, self._thread
        if lines is not None:
            lines.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.join_timeout_s)
        self._invalidate()

    # --- the reader thread ----------------------------------------------------------------------

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if first or self.connection.is_alive():
                    self._run_once()
                else:
                    self._problem("the SSH connection to the node is down; waiting for it")
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any failure
                self._problem(f"nvidia-smi watch failed: {type(exc).__name__}: {exc}")
            first = False
            self._invalidate()
            self._stop.wait(max(0.0, started + self.restart_every_s - time.monotonic()))

    def _run_once(self) -> None:
        try:
            lines = self.connection.stream(
                self.command, pty=True, idle_timeout_s=self.hang_after_s, max_line=MAX_LINE
            )
        except OrchError as exc:
            self._problem(f"could not start nvidia-smi: {exc.message}")
            return
        with self._lock:
            self._lines = lines
            self._starts += 1
        try:
            if not self._stop.is_set():
                self._pump(lines)
        finally:
            with self._lock:
                self._lines = None
            lines.close()

    def _pump(self, lines: CommandLines) -> None:
        """Read lines until nvidia-smi exits, hangs, the connection drops, or stop()."""
        tail: collections.deque[str] = collections.deque(maxlen=5)
        try:
            for text in lines:
                self._line(text, tail)
        except StreamStalled:
            self._problem(
                f"nvidia-smi printed nothing for {self.hang_after_s:.0f} s; restarting it"
            )
            return
        except OrchError as exc:
            self._problem(f"lost the nvidia-smi channel: {exc.__cause__ or exc.message}")
            return
        if self._stop.is_set():
            return
        self._exited(lines.exit_status(2.0), list(tail))

    def _line(self, line: str, tail: collections.deque[str]) -> None:
        text = line.strip()
        if not text:
            return
        sample = parse_line(text)
        now = self._now()
        with self._lock:
            if sample.index is None:  # not an answer yet: the shell's "not found" comes so
                tail.append(text[:200])
                self._error = f"unexpected output from nvidia-smi: {text[:120]!r}"
                self._invalidate_locked(now)
                return
            if self.gpu_indices is not None and sample.index not in self.gpu_indices:
                return  # a GPU of the machine that is not this node's
            self._samples[sample.index] = (sample, now)
            self._available = True
            self._answered.set()
            if sample.ok:  # an unknown utilization is told by the sample itself
                self._updated_at = now
                self._error = None

    def _exited(self, code: int | None, tail: list[str]) -> None:
        self._answered.set()
        said = " | ".join(tail)
        lowered = said.lower()
        status = "without an exit status" if code is None or code < 0 else f"with status {code}"
        with self._lock:
            if code == 127 or ("nvidia-smi" in lowered and "not found" in lowered):
                self._available = False
                self._error = f"nvidia-smi is not installed on the node ({said or status})"
            elif "no devices were found" in lowered:
                self._available = False
                self._error = "nvidia-smi found no GPU on the node"
            else:
                self._error = f"nvidia-smi exited {status}" + (f": {said}" if said else "")
            self._invalidate_locked(self._now())

    def _problem(self, message: str) -> None:
        self._answered.set()
        with self._lock:
            self._error = message
            self._invalidate_locked(self._now())

    def _invalidate(self) -> None:
        with self._lock:
            self._invalidate_locked(self._now())

    def _invalidate_locked(self, now: float) -> None:
        """Every GPU known so far becomes unknown (keeping its index and uuid)."""
        for index, (sample, _) in self._samples.items():
            self._samples[index] = (GpuSample.unknown(index, sample.uuid), now)


class CpuWatcher:
    """CPU use of a job's processes on one node, for nodes without nvidia-smi.

    Each `sample(now)` runs `cpu_ticks_command` once on the node's existing connection (no
    new connection, nothing left running) and returns the job's CPU use since the previous
    good reading, in percent of one core, or None when unknown: on the first call, when the
    job has no session yet (no pid file), when the node cannot be reached, or when two
    readings cannot be compared (see `cpu_percent`). `since` is when the use it returned
    began: the time (`now`, the caller's clock) of that previous reading. Never raises for a
    node's failure; `error` says what went wrong last (None after a good reading).
    """

    def __init__(
        self, connection: NodeConnection, pid_file_expr: str, *, timeout_s: float = 15.0
    ) -> None:
        self.connection = connection
        self.command = cpu_ticks_command(pid_file_expr)
        self.timeout_s = timeout_s
        self.last: CpuReading | None = None
        self.last_at: float | None = None  # when `last` was read (the caller's clock)
        self.since: float | None = None  # when the use the last sample returned began
        self.error: str | None = None

    @classmethod
    def for_job(
        cls, connection: NodeConnection, layout: NodeLayout, *, timeout_s: float = 15.0
    ) -> CpuWatcher:
        """Watch the session whose leader's pid is in the job's `pid` file (see launch.py)."""
        return cls(connection, home_expr(f"{layout.run_dir}/pid"), timeout_s=timeout_s)

    def read(self) -> CpuReading | None:
        """One raw reading of the session's CPU time; None (and `error` set) on failure."""
        try:
            result = self.connection.run(
                self.command, timeout=self.timeout_s, check=False, max_output=CPU_MAX_OUTPUT
            )
        except OrchError as exc:
            self.error = f"could not read CPU use: {exc.message}"
            return None
        reading = parse_cpu_ticks(result.stdout) if result.ok else None
        if reading is None:
            detail = result.tail(3) or f"exit status {result.exited}"
            self.error = f"no CPU reading for the job's session: {detail}"
        return reading

    def sample(self, now: float | None = None) -> float | None:
        """Percent of one core used by the job since the previous good reading (None: unknown),
        read at `now` (default `time.monotonic()`)."""
        now = time.monotonic() if now is None else now
        reading = self.read()
        if reading is None:
            return None
        previous, self.last = self.last, reading
        self.since, self.last_at = self.last_at, now
        percent = None if previous is None else cpu_percent(previous, reading)
        self.error = None if percent is not None or previous is None else "readings not comparable"
        return percent
