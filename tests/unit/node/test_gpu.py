"""nvidia-smi parsing, the idle policy, the CPU fallback and downsampling (no network)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.node.gpu import (
    CPU_MARK,
    QUERY_FIELDS,
    CpuReading,
    Downsampler,
    GpuSample,
    IdlePolicy,
    NodeGpuState,
    cpu_percent,
    cpu_ticks_command,
    gpus_busy,
    job_busy,
    node_busy,
    nvidia_smi_argv,
    parse_cpu_ticks,
    parse_line,
)
from tests.support.fuzzing import examples
from tests.support.waiting import wait_until

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
UUID = "GPU-5e2b6a5c-1f0d-4c4e-9a7b-2d9f1c3e8a10"


def sample(index: int, util: float | None) -> GpuSample:
    return GpuSample(index, UUID, util, 1000.0, 143771.0, util is not None)


def busy_node(*utils: float | None) -> list[GpuSample]:
    return [sample(i, u) for i, u in enumerate(utils)]


# --- argv and parsing -----------------------------------------------------------------------


def test_argv_asks_for_a_headerless_unitless_loop() -> None:
    assert nvidia_smi_argv(2) == [
        "nvidia-smi",
        "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total",
        "--format=csv,noheader,nounits",
        "-l",
        "2",
    ]
    assert QUERY_FIELDS.split(",")[2] == "utilization.gpu"
    for bad in (0, -1, True):
        with pytest.raises(ValueError):
            nvidia_smi_argv(bad)


def test_recorded_h200_output_parses() -> None:
    lines = (FIXTURES / "nvidia_smi_h200.csv").read_text().splitlines()
    samples = [parse_line(line) for line in lines]
    assert all(s.ok for s in samples)
    assert {s.index for s in samples} == set(range(8))
    assert all(s.uuid and s.uuid.startswith("GPU-") for s in samples)
    assert all(s.mem_total_mib == 143771 and s.util_pct and s.util_pct >= 90 for s in samples)


def test_a_good_line() -> None:
    assert parse_line(f"3, {UUID}, 97, 40123, 143771") == GpuSample(
        3, UUID, 97.0, 40123.0, 143771.0, True
    )
    # Extra spaces, CRLF (a pty), units (when `nounits` is missing) are all fine.
    assert parse_line(f"  3 ,{UUID} ,  97 %, 40123 MiB ,143771 MiB \r\n") == parse_line(
        f"3, {UUID}, 97, 40123, 143771"
    )
    assert parse_line(f"0, {UUID}, 0, 0, 81559").util_pct == 0.0


@pytest.mark.parametrize("na", ["N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "", "x"])
def test_unknown_utilization_keeps_index_and_memory(na: str) -> None:
    got = parse_line(f"1, {UUID}, {na}, 512, 143771")
    assert got == GpuSample(1, UUID, None, 512.0, 143771.0, False)


def test_unknown_memory_and_uuid_do_not_hide_utilization() -> None:
    got = parse_line("0, [N/A], 55, [Not Supported], N/A")
    assert got == GpuSample(0, None, 55.0, None, None, True)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
        "sure that the latest NVIDIA driver is installed and running.",
        "No devices were found",
        "Failed to initialize NVML: Driver/library version mismatch",
        "index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB]",
        f"0, {UUID}, 97",  # missing fields
        f"0, {UUID}, 97, 1, 2, 3",  # extra field
        f"-1, {UUID}, 97, 1, 2",
        f"GPU0, {UUID}, 97, 1, 2",
        f"٣, {UUID}, 97, 1, 2",  # a non-ASCII digit is not an index
        "\x00\xff\x1b[31m garbage \ufffd,,,,",
        ",,,,",
    ],
)
def test_lines_that_are_not_records(line: str) -> None:
    assert parse_line(line) == GpuSample.unknown()


@pytest.mark.parametrize("util", ["101", "-3", "nan", "inf", "1e3", "9" * 400, "٩٧", "0x10"])
def test_implausible_utilization_is_unknown(util: str) -> None:
    got = parse_line(f"0, {UUID}, {util}, 1, 2")
    assert got.index == 0 and got.util_pct is None and not got.ok


@settings(max_examples=examples(500), deadline=None)
@given(st.text())
def test_parse_line_never_raises_on_any_text(line: str) -> None:
    got = parse_line(line)
    assert got.ok == (got.util_pct is not None)
    if got.util_pct is not None:
        assert 0.0 <= got.util_pct <= 100.0


@settings(max_examples=examples(300), deadline=None)
@given(st.binary())
def test_parse_line_never_raises_on_decoded_bytes(raw: bytes) -> None:
    got = parse_line(raw.decode("utf-8", errors="replace"))
    assert got.ok == (got.util_pct is not None)
    if got.util_pct is not None:
        assert 0.0 <= got.util_pct <= 100.0


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(-5, 200).map(str), st.sampled_from(["N/A", "[N/A]", " ", "%"])),
        min_size=5,
        max_size=5,
    )
)
def test_record_shaped_lines_never_raise(fields: list[str]) -> None:
    got = parse_line(", ".join(fields))
    assert got.ok == (got.util_pct is not None)


# --- busy / idle / unknown ------------------------------------------------------------------


def test_gpus_busy_is_three_valued() -> None:
    assert gpus_busy(busy_node(90, 0)) is True  # one busy GPU is enough
    assert gpus_busy(busy_node(90, None)) is True  # busy is busy even next to an unknown
    assert gpus_busy(busy_node(0, 4.9)) is False
    assert gpus_busy(busy_node(0, 5.0)) is True  # the threshold itself is busy
    assert gpus_busy(busy_node(0, None)) is None
    assert gpus_busy([]) is None
    assert gpus_busy([GpuSample.unknown()]) is None


def test_node_busy_accepts_every_kind_of_reading() -> None:
    assert node_busy(NodeGpuState(True, tuple(busy_node(0, 0)))) is False
    assert node_busy(NodeGpuState(True, tuple(busy_node(0, 50)))) is True
    assert node_busy(NodeGpuState(None)) is None  # not known yet
    assert node_busy(NodeGpuState(False)) is None  # no nvidia-smi: the caller uses the CPU
    assert node_busy(busy_node(1, 2)) is False
    assert node_busy(55.0) is True and node_busy(3.0) is False and node_busy(10) is True
    assert node_busy(float("nan")) is None and node_busy(-1.0) is None and node_busy(None) is None
    assert node_busy(8.0, cpu_threshold_pct=5.0) is True


def test_job_busy_needs_every_node_idle() -> None:
    assert job_busy([False, False]) is False
    assert job_busy([False, True]) is True
    assert job_busy([False, None]) is None
    assert job_busy([None, True]) is True
    assert job_busy([]) is None


def test_a_busy_job_is_never_idle() -> None:
    policy = IdlePolicy(timeout_s=10)
    for t in range(100):
        assert policy.update(float(t), [busy_node(97, 99), busy_node(60)]) is False
    assert policy.idle_for(100.0) == 0.0


def test_idle_exactly_after_the_timeout() -> None:
    policy = IdlePolicy(timeout_s=10)
    policy.update(0.0, [busy_node(97, 97)])
    policy.update(1.0, [busy_node(0, 0)])  # the clock starts at the first idle observation
    for t in range(2, 11):
        assert policy.update(float(t), [busy_node(0, 0)]) is False
    assert policy.idle_for(10.5) == 9.5 and not policy.is_idle(10.999)
    assert policy.is_idle(11.0) and policy.update(11.0, [busy_node(0, 0)])
    assert policy.idle_for(11.0) == 10.0


def test_one_busy_gpu_on_any_node_keeps_the_job_alive() -> None:
    policy = IdlePolicy(timeout_s=5)
    for t in range(20):
        policy.update(float(t), [busy_node(0, 0, 0), busy_node(0, 0, 80)])
    assert not policy.is_idle(20.0)


@pytest.mark.parametrize(
    "unknown",
    [
        [busy_node(0, None)],  # N/A utilization
        [busy_node(0, 0), []],  # a node without a fresh sample
        [busy_node(0, 0), None],  # a node that could not be read
        [NodeGpuState(True, (GpuSample.unknown(0),))],  # stale or garbage
        [busy_node(0, 0), float("nan")],
    ],
)
def test_an_unknown_reading_resets_the_clock(unknown: list) -> None:
    policy = IdlePolicy(timeout_s=10)
    for t in range(9):
        policy.update(float(t), [busy_node(0, 0)])
    assert policy.idle_for(8.0) == 8.0
    assert policy.update(9.0, unknown) is False
    assert policy.idle_for(9.0) == 0.0
    policy.update(10.0, [busy_node(0, 0)])
    assert not policy.is_idle(19.9) and policy.is_idle(20.0)


def test_cpu_readings_use_their_own_threshold() -> None:
    policy = IdlePolicy(timeout_s=3, cpu_threshold_pct=10.0)
    for t in range(5):
        policy.update(float(t), [4.0, 9.9])
    assert policy.is_idle(4.0)
    policy.update(5.0, [4.0, 10.0])
    assert not policy.is_idle(5.0)


def test_a_gap_in_observations_restarts_the_clock() -> None:
    policy = IdlePolicy(timeout_s=10, max_gap_s=5)
    policy.observe(0.0, False)
    policy.observe(4.0, False)
    assert policy.idle_for(4.0) == 4.0
    policy.observe(30.0, False)  # nobody looked for 26 s
    assert policy.idle_for(30.0) == 0.0 and not policy.is_idle(39.0) and policy.is_idle(40.0)
    policy.reset()
    assert policy.idle_for(50.0) == 0.0


def test_policy_validates_its_timeout() -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            IdlePolicy(timeout_s=bad)


# --- CPU fallback ---------------------------------------------------------------------------


def test_parse_cpu_ticks() -> None:
    assert parse_cpu_ticks(f"{CPU_MARK} 1234 3 100 5012.47\n") == CpuReading(1234, 100, 5012.47, 3)
    assert parse_cpu_ticks(f"motd noise\n{CPU_MARK} 0 0 100 1.00") == CpuReading(0, 100, 1.0, 0)
    for bad in (
        f"{CPU_MARK} none",
        "",
        "garbage",
        f"{CPU_MARK} 12 3 100",
        f"{CPU_MARK} -12 3 100 5.0",
        f"{CPU_MARK} 12 3 0 5.0",
        f"{CPU_MARK} 12 3 100 nan",
        f"{CPU_MARK} ١٢ 3 100 5.0",
    ):
        assert parse_cpu_ticks(bad) is None, bad


@settings(max_examples=examples(200), deadline=None)
@given(st.text())
def test_parse_cpu_ticks_never_raises(text: str) -> None:
    for output in (text, f"{CPU_MARK} {text}"):
        got = parse_cpu_ticks(output)
        assert got is None or isinstance(got, CpuReading)
        if got is not None:  # what it reads back is a sane reading, or nothing
            assert got.ticks >= 0 and got.clk_tck > 0 and got.processes >= 0
            assert got.uptime_s == got.uptime_s  # not NaN


def test_cpu_percent_is_percent_of_one_core() -> None:
    prev = CpuReading(1000, 100, 50.0, 4)
    assert cpu_percent(prev, CpuReading(1100, 100, 52.0, 4)) == 50.0
    assert cpu_percent(prev, CpuReading(1400, 100, 52.0, 4)) == 200.0  # two busy cores
    assert cpu_percent(prev, CpuReading(1000, 100, 60.0, 4)) == 0.0
    assert cpu_percent(prev, CpuReading(1100, 100, 50.0, 4)) is None  # no time passed
    assert cpu_percent(prev, CpuReading(1100, 100, 10.0, 4)) is None  # rebooted
    assert cpu_percent(prev, CpuReading(900, 100, 52.0, 3)) is None  # a process left
    assert cpu_percent(prev, CpuReading(1100, 250, 52.0, 4)) is None


NASTY_COMM = "a) 1 2 (b\n) R"  # spaces, parentheses and a newline in the process name


def test_cpu_ticks_command_counts_the_job_despite_odd_names(tmp_path: Path) -> None:
    """Run the command with bash against real processes, one renamed to break naive parsers."""
    busy_loop = (
        f"open('/proc/self/comm', 'w').write({NASTY_COMM!r})\n"
        "import time\n"
        "end = time.monotonic() + 30\n"
        "while time.monotonic() < end: pass\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", busy_loop], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        # Counted once it bears the odd name: on a loaded machine the interpreter's start can
        # take longer than the first readings.
        comm = Path(f"/proc/{leader.pid}/comm")
        wait_until(lambda: comm.read_text().startswith("a) 1 2 (b"), "the odd name", 30)
        pid_file = tmp_path / "pid"
        pid_file.write_text(f"{leader.pid}\n")
        command = cpu_ticks_command(shlex.quote(str(pid_file)))
        # Run it through sh: the command brings its own bash.
        first = parse_cpu_ticks(_sh(command))
        assert first is not None
        # The busy loop's ticks are counted: they grow (a loaded machine gives it less than a
        # core, so how fast is not the point)
        second = wait_until(
            lambda: (now := parse_cpu_ticks(_sh(command))) and now.ticks > first.ticks and now,
            "the busy loop's ticks to grow", 15, interval=0.3,
        )  # fmt: skip
        assert comm.read_text().startswith("a) 1 2 (b")
        assert second.processes == 1 and second.clk_tck == os.sysconf("SC_CLK_TCK")
        percent = cpu_percent(first, second)
        assert percent is not None and percent > 0, percent
    finally:
        leader.kill()
        leader.wait()
    assert parse_cpu_ticks(_sh(cpu_ticks_command(shlex.quote(str(tmp_path / "none"))))) is None
    (tmp_path / "junk").write_text("12; rm -rf /\n")
    assert parse_cpu_ticks(_sh(cpu_ticks_command(shlex.quote(str(tmp_path / "junk"))))) is None


def test_cpu_ticks_command_counts_descendants_in_other_sessions(tmp_path: Path) -> None:
    """torchrun starts each worker in a new session: the job is the launch script's tree."""
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time\\nend = time.monotonic() + 30\\nwhile time.monotonic() < end: pass'],"
        " start_new_session=True)\n"
        "time.sleep(30)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        pid_file = tmp_path / "pid"
        pid_file.write_text(f"{leader.pid}\n")
        command = cpu_ticks_command(shlex.quote(str(pid_file)))
        child = _wait_child_of(leader.pid)
        # The child's own readings are taken inside the session's two, so whatever it ran
        # between them the session's second reading holds too, however loaded the machine.
        first = parse_cpu_ticks(_sh(command))
        child_first = _own_ticks(child)
        time.sleep(1.0)  # the readings' window
        child_second = _own_ticks(child)
        second = parse_cpu_ticks(_sh(command))
        assert first is not None and second is not None and second.processes == 2
        # The busy grandchild's own time is in the session's: on a loaded machine it may get
        # little of a core, but whatever it got is counted (its parent only sleeps).
        assert child_second - child_first >= 1, "the busy child never ran"
        assert second.ticks - first.ticks >= child_second - child_first - 1
    finally:
        for stat in Path("/proc").glob("[0-9]*/stat"):  # the child outlives its parent otherwise
            try:
                ppid = stat.read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if ppid == str(leader.pid):
                os.kill(int(stat.parent.name), 9)
        leader.kill()
        leader.wait()


def test_cpu_ticks_command_with_a_session_of_no_processes(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    pid_file.write_text("4194304999\n")  # no such session
    reading = parse_cpu_ticks(_sh(cpu_ticks_command(shlex.quote(str(pid_file)))))
    assert reading is not None and reading.ticks == 0 and reading.processes == 0


def _wait_child_of(pid: int) -> int:
    """The pid of `pid`'s one child process, once it exists."""

    def child() -> int | None:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if stat.read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                    return int(stat.parent.name)
            except (OSError, IndexError):
                continue
        return None

    return wait_until(child, f"a child of {pid}", 10, interval=0.05)


def _own_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _sh(command: str) -> str:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=True, timeout=30
    ).stdout


# --- downsampling ---------------------------------------------------------------------------


def test_downsampler_emits_one_average_per_window_and_key() -> None:
    down = Downsampler(every_s=10)
    emitted = []
    for t in range(25):
        for gpu in (0, 1):
            util = float(t) if gpu == 0 else 100.0
            got = down.add(("node0", gpu), float(t), sample(gpu, util))
            if got is not None:
                emitted.append(got)
    assert [(w.key, w.start, w.count) for w in emitted] == [
        (("node0", 0), 0.0, 10),
        (("node0", 1), 0.0, 10),
        (("node0", 0), 10.0, 10),
        (("node0", 1), 10.0, 10),
    ]
    assert emitted[0].sample.util_pct == 4.5 and emitted[0].sample.ok
    assert emitted[2].sample.util_pct == 14.5 and emitted[1].sample.util_pct == 100.0
    rest = down.flush()
    assert sorted((w.key, w.start, w.count) for w in rest) == [
        (("node0", 0), 20.0, 5),
        (("node0", 1), 20.0, 5),
    ]
    assert down.flush() == []


def test_downsampler_averages_only_known_values() -> None:
    down = Downsampler(every_s=5)
    down.add("g", 0.0, sample(0, 10.0))
    down.add("g", 1.0, GpuSample.unknown(0, UUID))
    down.add("g", 2.0, sample(0, 30.0))
    down.add("g", 1.5, sample(0, 50.0))  # late but still in the open window
    window = down.add("g", 5.0, GpuSample.unknown(0, UUID))
    assert window is not None and window.count == 4
    assert window.sample == GpuSample(0, UUID, 30.0, 1000.0, 143771.0, True)
    down.add("g", 3.0, sample(0, 99.0))  # older than the open window: joins it
    (unknown,) = down.flush()
    assert unknown.start == 5.0 and unknown.count == 2
    assert unknown.sample.util_pct == 99.0
    all_unknown = Downsampler(every_s=5)
    all_unknown.add("g", 0.0, GpuSample.unknown(0, UUID))
    (only,) = all_unknown.flush()
    assert only.sample == GpuSample(0, UUID, None, None, None, False)
    with pytest.raises(ValueError):
        Downsampler(every_s=0)


def test_downsampler_keeps_narrow_windows_for_the_first_seconds_then_wide_ones() -> None:
    down = Downsampler(every_s=30, early_every_s=5, early_for_s=60)
    starts = []
    for t in range(100, 200):  # one sample a second, the first at 100 on the caller's clock
        window = down.add("g", float(t), sample(0, 50.0))
        if window is not None:
            starts.append((window.start, window.count))
    starts += [(w.start, w.count) for w in down.flush()]
    # Windows of 5 s until 160 (100 + 60); then windows of 30 s aligned to multiples of 30:
    # 160..179 falls in 150's, older than the open early window, so it joins that one.
    assert starts == [(float(s), 5) for s in range(100, 155, 5)] + [(155.0, 25), (180.0, 20)]
    plain = Downsampler(every_s=30)  # without early windows: 30 s from the start
    assert [plain.add("g", float(t), sample(0, 1.0)) is not None for t in (100, 119, 120)] == [
        False,
        False,
        True,
    ]
    with pytest.raises(ValueError):
        Downsampler(every_s=30, early_every_s=0, early_for_s=60)
