"""GPU and CPU activity of a job's nodes: nvidia-smi parsing, idleness, the CPU fallback.

Everything here is pure (no I/O); `orchestrator.cluster.gpu_watch` runs the commands on the nodes.

Readings are three-valued on purpose. A GPU is busy, idle, or *unknown* (nvidia-smi said
`N/A`, printed garbage, failed, hung, or its last reading is stale). Unknown never counts as
idle: a job is stopped for idleness only on readings that can be trusted.

Flow, per node and controller tick:

    nvidia-smi -l N  --lines-->  parse_line()  -->  GpuSample per GPU  (gpu_watch keeps the
                                                                        latest: NodeGpuState)
    NodeGpuState | CPU %  -->  node_busy()  -->  True / False / None  (busy / idle / unknown)
    every node's answer   -->  IdlePolicy.update(now, ...)  -->  idle for `timeout_s`?
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

QUERY_FIELDS = "index,uuid,utilization.gpu,memory.used,memory.total"
"""The nvidia-smi query fields, in the order `parse_line` expects them."""

DEFAULT_GPU_THRESHOLD_PCT = 5.0  # a GPU below this utilization is idle
DEFAULT_CPU_THRESHOLD_PCT = 10.0  # a GPU-less node's job below this % of one core is idle


def nvidia_smi_argv(interval_s: int) -> list[str]:
    """argv of a long-running nvidia-smi printing one CSV record per GPU every `interval_s`.

    Each record is `index, uuid, utilization.gpu, memory.used, memory.total` (no header, no
    units). Raises ValueError when `interval_s` is not a whole number of seconds >= 1.
    """
    if isinstance(interval_s, bool) or not isinstance(interval_s, int) or interval_s < 1:
        raise ValueError(
            f"nvidia-smi loop interval must be a whole number >= 1, not {interval_s!r}"
        )
    return [
        "nvidia-smi",
        f"--query-gpu={QUERY_FIELDS}",
        "--format=csv,noheader,nounits",
        "-l",
        str(interval_s),
    ]


# --- nvidia-smi records ---------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading (one line of nvidia-smi output).

    `ok` is True only for a proper record with a known utilization. A proper record whose
    utilization is unknown (`N/A`, `[Not Supported]`, ...) keeps its index, uuid and memory
    with `util_pct=None, ok=False`. A line that is not a record at all has every field None.
    """

    index: int | None  # nvidia-smi's GPU index on the node
    uuid: str | None  # "GPU-..." (or "MIG-..."), stable across reboots
    util_pct: float | None  # utilization.gpu, 0..100
    mem_used_mib: float | None
    mem_total_mib: float | None
    ok: bool  # False: utilization unknown, never treated as idle

    @classmethod
    def unknown(cls, index: int | None = None, uuid: str | None = None) -> GpuSample:
        """A reading that says nothing (for a stale or unparseable GPU), keeping its identity."""
        return cls(index, uuid, None, None, None, False)


_FIELD_COUNT = len(QUERY_FIELDS.split(","))
_INDEX = re.compile(r"[0-9]{1,4}", re.ASCII)
_NUMBER = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?", re.ASCII)
_UNIT = re.compile(r"\s*(?:%|MiB)\Z")
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-/:.]{0,127}", re.ASCII)
_NOT_A_VALUE = {"n/a", "[n/a]", "[not supported]", "[unknown error]", "[insufficient permissions]"}


def _number(text: str, upper: float | None = None) -> float | None:
    """A finite, non-negative number (optionally <= upper), or None for anything else."""
    text = _UNIT.sub("", text.strip())
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    if not math.isfinite(value) or (upper is not None and value > upper):
        return None
    return value


def parse_line(line: str) -> GpuSample:
    """Parse one line of `nvidia_smi_argv` output; never raises.

    Accepts extra spaces, a trailing CR, and unit suffixes (`97 %`, `40123 MiB`). Anything
    that is not exactly `QUERY_FIELDS` with a numeric index (empty lines, driver errors such
    as "NVIDIA-SMI has failed ...", "No devices were found", binary junk) gives
    `GpuSample.unknown()`. Values that are not plain numbers in range (`N/A`,
    `[Not Supported]`, `[N/A]`, negative, above 100 % utilization) become None.
    """
    fields = [f.strip() for f in line.strip().split(",")]
    if len(fields) != _FIELD_COUNT or not _INDEX.fullmatch(fields[0]):
        return GpuSample.unknown()
    index = int(fields[0])
    raw_uuid = fields[1]
    uuid = raw_uuid if _UUID.fullmatch(raw_uuid) and raw_uuid.lower() not in _NOT_A_VALUE else None
    util = _number(fields[2], upper=100.0)
    return GpuSample(
        index=index,
        uuid=uuid,
        util_pct=util,
        mem_used_mib=_number(fields[3]),
        mem_total_mib=_number(fields[4]),
        ok=util is not None,
    )


@dataclass(frozen=True)
class NodeGpuState:
    """What a node's nvidia-smi said lately (built by `gpu_watch.GpuWatcher.latest`).

    `samples` holds one entry per GPU index ever seen on the node, in index order; a GPU whose
    last reading is stale, or any GPU after nvidia-smi failed, hung or printed garbage, is
    `GpuSample.unknown(index, uuid)`.
    """

    available: bool | None  # None: not known yet; False: no usable nvidia-smi (use the CPU)
    samples: tuple[GpuSample, ...] = ()
    error: str | None = None  # the latest problem; None once good records arrive again
    updated_at: float | None = None  # arrival time of the newest good record

    @property
    def ok(self) -> bool:
        """True when every GPU of the node has a trusted, fresh reading."""
        return bool(self.available and self.samples and all(s.ok for s in self.samples))


# --- idleness -------------------------------------------------------------------------------

NodeReading = NodeGpuState | Sequence[GpuSample] | float | None
"""One node's activity for `node_busy`: its GPU state or samples, its job's CPU % of one core
(the fallback on nodes without nvidia-smi), or None when nothing could be read."""


def gpus_busy(
    samples: Sequence[GpuSample], threshold_pct: float = DEFAULT_GPU_THRESHOLD_PCT
) -> bool | None:
    """True if any GPU is at or above the threshold; False if every GPU is known and below it;
    None (unknown) when there are no samples or one of them is unknown."""
    if any(s.ok and s.util_pct is not None and s.util_pct >= threshold_pct for s in samples):
        return True
    if not samples or not all(s.ok for s in samples):
        return None
    return False


def node_busy(
    reading: NodeReading,
    *,
    gpu_threshold_pct: float = DEFAULT_GPU_THRESHOLD_PCT,
    cpu_threshold_pct: float = DEFAULT_CPU_THRESHOLD_PCT,
) -> bool | None:
    """Whether one node's job is busy (True), idle (False), or unknown (None).

    A `NodeGpuState` whose nvidia-smi is unavailable or unknown yet gives None: the caller
    should pass the node's CPU % instead. A CPU % (float) is busy at or above
    `cpu_threshold_pct`; NaN or a negative value is unknown.
    """
    if reading is None:
        return None
    if isinstance(reading, NodeGpuState):
        if not reading.available:
            return None
        return gpus_busy(reading.samples, gpu_threshold_pct)
    if isinstance(reading, int | float):
        value = float(reading)
        if not math.isfinite(value) or value < 0:
            return None
        return value >= cpu_threshold_pct
    return gpus_busy(list(reading), gpu_threshold_pct)


def job_busy(per_node: Sequence[bool | None]) -> bool | None:
    """Combine nodes: busy if any node is busy, idle only if every node is idle, else unknown.

    An empty sequence (no node answered) is unknown.
    """
    if any(b is True for b in per_node):
        return True
    if not per_node or any(b is None for b in per_node):
        return None
    return False


@dataclass
class IdlePolicy:
    """Decides when a job has been idle long enough to be stopped.

    Feed it one observation per controller tick, `update(now, readings)` (one reading per
    node) or `observe(now, busy)`. The idle clock starts at the first observation in which
    every GPU of every node (or, on GPU-less nodes, the job's CPU use) is below its threshold,
    and restarts at any observation that is busy or unknown. `is_idle(now)` is True once the
    clock has run for `timeout_s` seconds. With `max_gap_s` set, an observation that comes
    more than `max_gap_s` after the previous one also restarts the clock (nobody watched in
    between). Times are seconds on one monotonic clock.
    """

    timeout_s: float
    threshold_pct: float = DEFAULT_GPU_THRESHOLD_PCT
    cpu_threshold_pct: float = DEFAULT_CPU_THRESHOLD_PCT
    max_gap_s: float | None = None
    _idle_since: float | None = field(default=None, init=False, repr=False)
    _last_seen: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or not math.isfinite(self.timeout_s):
            raise ValueError(f"idle timeout must be a positive number of seconds: {self.timeout_s}")

    def observe(self, now: float, busy: bool | None) -> None:
        """Record one observation of the whole job: busy, idle (False) or unknown (None)."""
        gap = self.max_gap_s is not None and (
            self._last_seen is not None and now - self._last_seen > self.max_gap_s
        )
        self._last_seen = now
        if busy is not False:
            self._idle_since = None
        elif gap or self._idle_since is None:
            self._idle_since = now

    def update(self, now: float, readings: Sequence[NodeReading]) -> bool:
        """Observe one reading per node (see `NodeReading`); return `is_idle(now)`."""
        flags = [
            node_busy(
                r, gpu_threshold_pct=self.threshold_pct, cpu_threshold_pct=self.cpu_threshold_pct
            )
            for r in readings
        ]
        self.observe(now, job_busy(flags))
        return self.is_idle(now)

    def idle_for(self, now: float) -> float:
        """Seconds the job has been idle without interruption (0.0 when it is not idle)."""
        if self._idle_since is None:
            return 0.0
        return max(0.0, now - self._idle_since)

    def is_idle(self, now: float) -> bool:
        """True once the job has been idle for at least `timeout_s` seconds."""
        return self._idle_since is not None and self.idle_for(now) >= self.timeout_s

    def reset(self) -> None:
        """Forget the idle clock (e.g. after the job was restarted on new nodes)."""
        self._idle_since = None
        self._last_seen = None


# --- CPU fallback ---------------------------------------------------------------------------

CPU_MARK = "@@orch-cpu@@"


@dataclass(frozen=True)
class CpuReading:
    """CPU time used so far by the processes of a job's session on one node."""

    ticks: int  # utime+stime+cutime+cstime summed over the session's processes
    clk_tck: int  # clock ticks per second on the node
    uptime_s: float  # the node's uptime when read (a monotonic clock)
    processes: int  # how many processes the session had


def cpu_ticks_command(session_pid_file_expr: str) -> str:
    """Shell command printing the CPU time of every process of a job on a node.

    `session_pid_file_expr` is a shell expression (already quoted, e.g. from
    `launch.home_expr`) for the file holding the pid of the job's launch script. The job's
    processes are that process and all its descendants (torchrun starts each worker in a
    session of its own, so the session id would miss them). Output is one line
    `@@orch-cpu@@ <ticks> <processes> <CLK_TCK> <uptime seconds>`, or `@@orch-cpu@@ none` when
    the file is missing or holds no pid. Ticks are each process's utime+stime plus the times
    of its reaped children (cutime+cstime), so short-lived helpers are counted too.
    /proc/<pid>/stat is split after the LAST ")" so a command name with spaces or parentheses
    cannot shift the fields. Runs under bash whatever the login shell; forks only for getconf.
    """
    script = (
        f'root=""; read -r root 2>/dev/null < {session_pid_file_expr}; '
        "root=${root//[[:space:]]/}; "
        f'case "$root" in ""|*[!0-9]*) echo "{CPU_MARK} none"; exit 0;; esac; '
        "declare -A parent ticks inside; "
        "for f in /proc/[0-9]*/stat; do "
        'line=""; IFS= read -r -d "" line 2>/dev/null < "$f"; '
        '[ -n "$line" ] || continue; '
        "pid=${f#/proc/}; pid=${pid%/stat}; "
        "rest=${line##*)}; set -f; set -- $rest; set +f; "
        # after the comm: $1 state, $2 ppid, ..., ${12} utime, ${13} stime, ${14} cutime,
        # ${15} cstime
        "parent[$pid]=$2; ticks[$pid]=$((${12} + ${13} + ${14} + ${15})); "
        "done; "
        '[ -n "${ticks[$root]}" ] && inside[$root]=1; '
        "grew=1; while [ $grew = 1 ]; do grew=0; "
        "for pid in ${!parent[@]}; do "
        '[ -z "${inside[$pid]}" ] && [ -n "${inside[${parent[$pid]}]}" ] && '
        "{ inside[$pid]=1; grew=1; }; "
        "done; done; "
        "total=0; n=0; for pid in ${!inside[@]}; do total=$((total + ticks[$pid])); n=$((n + 1)); "
        "done; "
        "read -r up _ < /proc/uptime; "
        f'echo "{CPU_MARK} $total $n $(getconf CLK_TCK) $up"'
    )
    return "bash -c " + shlex.quote(script)


def parse_cpu_ticks(output: str) -> CpuReading | None:
    """Parse `cpu_ticks_command` output; None when there is no session or it is unreadable."""
    for line in output.splitlines():
        parts = line.split()
        if not parts or parts[0] != CPU_MARK:
            continue
        if len(parts) != 5:
            return None
        ticks, processes, clk, uptime = parts[1:]
        if not (ticks.isascii() and ticks.isdigit() and processes.isascii()):
            return None
        if not (processes.isdigit() and clk.isascii() and clk.isdigit()):
            return None
        up = _number(uptime)
        if up is None or int(clk) <= 0:
            return None
        return CpuReading(int(ticks), int(clk), up, int(processes))
    return None


def cpu_percent(prev: CpuReading, cur: CpuReading) -> float | None:
    """CPU use between two readings, in percent of one core (200.0 = two busy cores).

    None when the readings cannot be compared: no time passed or the clock went back (a
    reboot), the tick rates differ, or the tick count went down (processes left the session
    and took their time with them), so the result would not be trustworthy.
    """
    elapsed = cur.uptime_s - prev.uptime_s
    if elapsed <= 0 or cur.clk_tck != prev.clk_tck or cur.ticks < prev.ticks:
        return None
    return (cur.ticks - prev.ticks) / cur.clk_tck / elapsed * 100.0


# --- downsampling for storage ---------------------------------------------------------------


@dataclass(frozen=True)
class WindowSample:
    """The average of one key's samples over one window, from `start` to the next window."""

    key: Hashable  # e.g. (node rank, GPU index)
    start: float
    count: int  # samples averaged (known or not)
    sample: GpuSample  # averages of the known values; ok when some utilization was known
    first: float = 0.0  # the caller's clock at its first sample (the window's own time)


@dataclass
class _Window:
    start: float
    samples: list[GpuSample]
    first: float  # the clock at its first sample


class Downsampler:
    """Per key, turns a stream of samples into at most one averaged sample per window.

    Windows are aligned to multiples of their width on the caller's clock. The width is
    `every_s`, except for the first `early_for_s` seconds after the first sample (of any key),
    where it is `early_every_s` (when given): a short job then keeps enough samples to draw.
    `add` returns the previous window's `WindowSample` when a sample opens a new window for
    its key, else None; `flush` returns every pending window (e.g. when the job ends). A sample
    older than its key's open window is averaged into that window rather than reopening a
    past one.
    """

    def __init__(
        self, every_s: float, *, early_every_s: float | None = None, early_for_s: float = 0.0
    ) -> None:
        for width in (every_s, every_s if early_every_s is None else early_every_s):
            if not width > 0 or not math.isfinite(width):
                raise ValueError(f"downsampling window must be positive: {width}")
        self.every_s = every_s
        self.early_every_s = early_every_s
        self.early_for_s = early_for_s
        self._first: float | None = None  # the clock at the first sample
        self._open: dict[Hashable, _Window] = {}

    def width(self, now: float) -> float:
        """The width of the window a sample taken at `now` falls in."""
        if self._first is None:
            self._first = now
        early = self.early_every_s is not None and now < self._first + self.early_for_s
        return self.early_every_s if early and self.early_every_s is not None else self.every_s

    def add(self, key: Hashable, now: float, sample: GpuSample) -> WindowSample | None:
        width = self.width(now)
        start = math.floor(now / width) * width
        window = self._open.get(key)
        if window is not None and start <= window.start:
            window.samples.append(sample)
            return None
        self._open[key] = _Window(start, [sample], now)
        return None if window is None else _average(key, window)

    def flush(self) -> list[WindowSample]:
        done = [_average(key, window) for key, window in self._open.items()]
        self._open.clear()
        return done


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _average(key: Hashable, window: _Window) -> WindowSample:
    samples = window.samples
    last = samples[-1]
    util = _mean([s.util_pct if s.ok else None for s in samples])
    averaged = GpuSample(
        index=next((s.index for s in reversed(samples) if s.index is not None), last.index),
        uuid=next((s.uuid for s in reversed(samples) if s.uuid is not None), last.uuid),
        util_pct=util,
        mem_used_mib=_mean([s.mem_used_mib for s in samples]),
        mem_total_mib=_mean([s.mem_total_mib for s in samples]),
        ok=util is not None,
    )
    return WindowSample(key, window.start, len(samples), averaged, window.first)
