"""GPU and CPU watching on a real sshd node, with the nvidia-smi stand-in on the node's PATH.

The stand-in (tests/fixtures/nvidia_smi_replay.py) is installed as `$HOME/bin/nvidia-smi`; it
replays `$HOME/bin/nvidia-smi.trace`, which the tests rewrite while a watcher runs.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from orchestrator.cluster.activity import CPU_KEY, ActivityThresholds, JobActivity
from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.gpu_watch import CpuWatcher, GpuWatcher
from orchestrator.ledger.store import GpuSampleRecord, utcnow
from orchestrator.node.file_write import write_file_command
from orchestrator.node.gpu import DEFAULT_CPU_THRESHOLD_PCT, IdlePolicy, NodeGpuState, node_busy
from orchestrator.node.launch import NodeLayout, home_expr
from orchestrator.remote.ssh import NodeConnection
from tests.support.helpers import loopback_cluster, processes_with_marker
from tests.support.waiting import wait_until

STAND_IN = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_smi_replay.py"
INTERVAL = 1
BUSY = {"mode": "normal", "gpus": [[97, 40123, 143771], [88, 30211, 143771]]}
IDLE = {"mode": "normal", "gpus": [[0, 40123, 143771], [0, 30211, 143771]]}

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(
        tmp_path_factory.mktemp("orch"), "gpu", count=1, gpus_per_node=2
    ) as built:
        yield built


@pytest.fixture
def node(cluster: Cluster) -> NodeConnection:
    """The node with the stand-in installed and a busy trace."""
    connection = cluster.head
    connection.run(write_file_command("bin/nvidia-smi", "0755"), stdin=STAND_IN.read_text())
    write_trace(connection, BUSY)
    return connection


def write_trace(connection: NodeConnection, trace: dict | None) -> None:
    if trace is None:
        connection.run("rm -f bin/nvidia-smi.trace")
    else:
        connection.run(write_file_command("bin/nvidia-smi.trace"), stdin=json.dumps(trace))


def wait_for(what: Callable[[], T], timeout: float, message: str) -> T:
    return wait_until(what, message, timeout, interval=0.1)


def utils(state: NodeGpuState) -> list[float | None]:
    return [s.util_pct for s in state.samples]


def all_unknown(watcher: GpuWatcher) -> NodeGpuState | None:
    state = watcher.latest()
    return state if state.samples and not any(s.ok for s in state.samples) else None


def stand_ins(cluster: Cluster) -> list[int]:
    """Pids of nvidia-smi stand-ins running on the node."""
    pids = processes_with_marker(cluster.instances[0].instance_id)
    found = []
    for pid in pids:
        try:
            if b"--query-gpu" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def ssh_connections(port: int) -> int:
    """Established TCP connections to the node's sshd (its side of each connection)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def test_readings_follow_the_trace_over_one_channel(cluster: Cluster, node: NodeConnection) -> None:
    node.run("true")
    transport = node.transport
    port = cluster.instances[0].ssh_port
    assert ssh_connections(port) == 1
    watcher = GpuWatcher(node, INTERVAL, restart_every_s=1.0, hang_after_s=3.0)
    watcher.start()
    try:
        state = wait_for(
            lambda: (s := watcher.latest()).ok and utils(s) == [97.0, 88.0] and s,
            5,
            "busy readings",
        )
        assert state.available is True and state.error is None
        assert [s.index for s in state.samples] == [0, 1]
        assert [s.mem_used_mib for s in state.samples] == [40123.0, 30211.0]
        assert all(s.uuid and s.uuid.startswith("GPU-") for s in state.samples)
        assert node_busy(state) is True

        policy = IdlePolicy(timeout_s=1.5)
        assert policy.update(time.monotonic(), [watcher.latest()]) is False
        write_trace(node, IDLE)
        written = time.monotonic()
        wait_for(lambda: utils(watcher.latest()) == [0.0, 0.0], 2 * INTERVAL + 0.5, "idle")
        assert time.monotonic() - written <= 2 * INTERVAL + 0.5
        idle = wait_for(
            lambda: policy.update(time.monotonic(), [watcher.latest()]), 3, "idle policy"
        )
        assert idle and policy.idle_for(time.monotonic()) >= 1.5

        # One connection, one channel, one nvidia-smi the whole time.
        assert node.transport is transport
        assert ssh_connections(port) == 1
        assert len(stand_ins(cluster)) == 1
        assert watcher.starts == 1
    finally:
        watcher.stop()
    assert not watcher.running
    # Closing the channel hangs nvidia-smi up on the node.
    wait_for(lambda: not stand_ins(cluster), 3, "nvidia-smi ended after stop()")
    assert node.transport is transport and node.is_alive()


def test_garbage_failure_and_hang_are_unknown_then_recover(
    cluster: Cluster, node: NodeConnection
) -> None:
    watcher = GpuWatcher(node, INTERVAL, restart_every_s=1.0, hang_after_s=3.0)
    watcher.start()
    try:
        wait_for(lambda: watcher.latest().ok, 5, "first readings")

        write_trace(node, {"mode": "garbage"})
        state = wait_for(lambda: all_unknown(watcher), 3, "garbage makes readings unknown")
        assert "unexpected output" in (state.error or "") and watcher.running
        assert node_busy(state) is None
        write_trace(node, BUSY)
        wait_for(lambda: watcher.latest().ok, 3, "recovery after garbage")

        write_trace(node, {"mode": "fail"})
        state = wait_for(lambda: all_unknown(watcher), 3, "a failing nvidia-smi is unknown")
        error = wait_for(
            lambda: "status 9" in (e := watcher.latest().error or "") and e, 3, "exit reported"
        )
        assert "status 9" in error and "NVIDIA-SMI has failed" in error, error
        assert watcher.latest().available is True  # installed, but failing: not a CPU node
        write_trace(node, BUSY)
        wait_for(lambda: watcher.latest().ok, 4, "recovery after failure")

        write_trace(node, {"mode": "hang"})
        wait_for(lambda: all_unknown(watcher), 3 * INTERVAL + 2, "a hung nvidia-smi is unknown")
        wait_for(lambda: "printed nothing" in (watcher.latest().error or ""), 5, "hang detected")
        write_trace(node, BUSY)
        state = wait_for(lambda: (s := watcher.latest()).ok and s, 6, "recovery after hang")
        assert utils(state) == [97.0, 88.0]
        assert state.error is None
        assert len(stand_ins(cluster)) == 1  # the hung one was hung up, not left behind
        assert watcher.starts >= 3 and watcher.running
        assert ssh_connections(cluster.instances[0].ssh_port) == 1
    finally:
        watcher.stop()


def test_unknown_utilization_keeps_the_gpu_but_is_not_idle(node: NodeConnection) -> None:
    write_trace(node, {"mode": "normal", "gpus": [["[N/A]", 100, 143771], [0, 5, 143771]]})
    watcher = GpuWatcher(node, INTERVAL)
    watcher.start()
    try:
        state = wait_for(lambda: (s := watcher.latest()).samples and s, 5, "readings")
        first = state.samples[0]
        assert (first.index, first.util_pct, first.mem_used_mib, first.ok) == (0, None, 100, False)
        assert state.samples[1].ok and not state.ok
        assert node_busy(state) is None  # one GPU idle, one unknown: not idle
    finally:
        watcher.stop()


def test_a_node_with_a_share_of_the_machines_gpus_watches_only_those(
    node: NodeConnection,
) -> None:
    """An allocation on a shared machine: the machine's other GPU, busy with another job,
    is neither read nor counted; this node's own is idle, so the node is."""
    write_trace(node, {"mode": "normal", "gpus": [[97, 40123, 143771], [0, 5, 143771]]})
    watcher = GpuWatcher(node, INTERVAL, gpu_indices=(1,))
    watcher.start()
    try:
        state = wait_for(lambda: (s := watcher.latest()).ok and s, 5, "readings")
        assert [(s.index, s.util_pct) for s in state.samples] == [(1, 0.0)]
        assert node_busy(state) is False
    finally:
        watcher.stop()


def test_a_node_without_gpus_or_nvidia_smi_is_unavailable(node: NodeConnection) -> None:
    write_trace(node, None)  # the stand-in then says "No devices were found"
    watcher = GpuWatcher(node, INTERVAL, restart_every_s=1.0)
    watcher.start()
    try:
        state = wait_for(lambda: (s := watcher.latest()).available is False and s, 5, "no devices")
        assert "no GPU" in (state.error or "") and node_busy(state) is None
        node.run("rm -f bin/nvidia-smi")
        state = wait_for(
            lambda: "not installed" in ((s := watcher.latest()).error or "") and s,
            5,
            "missing nvidia-smi",
        )
        assert state.available is False and state.samples == ()
    finally:
        watcher.stop()


def start_session(node: NodeConnection, run_dir: str, name: str, program: str, *args: str) -> None:
    """Start `program args` detached in a new session under a name with spaces and
    parentheses; the session leader's pid lands in `<run_dir>/pid`, as launch.py does."""
    leader = f"echo $$ > pid.tmp && mv pid.tmp pid && exec {shlex.join(['./' + name, *args])}"
    node.run(
        f"mkdir -p {shlex.quote(run_dir)} && cd {shlex.quote(run_dir)} && "
        f"ln -sf {shlex.quote(program)} {shlex.quote(name)} && "
        f"setsid -f bash -c {shlex.quote(leader)} > /dev/null 2>&1 < /dev/null"
    )


def test_cpu_fallback_reads_the_jobs_session(node: NodeConnection) -> None:
    layout = NodeLayout("cpu-job")
    start_session(node, layout.run_dir, "busy ) (x", "/bin/bash", "-c", "while :; do :; done")
    start_session(node, "sleeper", "zz) (sleep", "/bin/sleep", "600")
    try:
        busy = CpuWatcher.for_job(node, layout)
        resting = CpuWatcher(node, home_expr("sleeper/pid"))
        wait_for(lambda: busy.read() and resting.read(), 5, "sessions started")
        assert busy.sample() is None and resting.sample() is None  # no previous reading yet
        readings = []
        # A loaded machine (parallel tests on 2 cores) gives the loop a fraction of a core, and
        # may starve it for a moment: what counts is that it reads as busy, clearly above idle.
        for _ in range(8):
            time.sleep(1.0)  # the sample's window: CPU time over this second
            readings.append((busy.sample(), resting.sample()))
            if (readings[-1][0] or 0) > 2 * DEFAULT_CPU_THRESHOLD_PCT:
                break
        busy_pct, resting_pct = readings[-1]
        assert busy_pct is not None and busy_pct > 2 * DEFAULT_CPU_THRESHOLD_PCT, readings
        assert resting_pct is not None and resting_pct < 10, resting_pct
        assert busy.last is not None and busy.last.processes == 1
        assert node_busy(busy_pct) is True and node_busy(resting_pct) is False

        missing = CpuWatcher(node, home_expr("no-such-job/pid"))
        assert missing.sample() is None and "no CPU reading" in (missing.error or "")
    finally:
        node.run(
            f"for d in {layout.run_dir} sleeper; do kill -9 -- -$(cat $d/pid) 2>/dev/null; done; "
            "true"
        )


# --- the samples a job's report draws start with its run ------------------------------------
SAMPLED_EVERY = 2.0  # the watch interval of the tests below


def sampled_from_running(cluster: Cluster, layout: NodeLayout) -> list[tuple[float, int, bool]]:
    """Watch the job's activity as the supervisor does from RUNNING (started, then a check at
    once and one each interval) for three checks: each sample kept, as (seconds after RUNNING
    of its time, GPU index, known), in time order."""
    recorded: list[GpuSampleRecord] = []
    activity = JobActivity(
        layout.job_id, cluster, layout, interval_s=SAMPLED_EVERY, gpus_per_node=2,
        idle_timeout_s=None, thresholds=ActivityThresholds(sample_every=30.0),
        record=recorded.extend,
    )  # fmt: skip
    running_at = utcnow()
    activity.start()
    try:
        for check in range(3):
            activity.tick()
            if check < 2:
                time.sleep(SAMPLED_EVERY)  # the subject: ticks one sampling interval apart
    finally:
        activity.stop()
    return sorted(((r.at - running_at).total_seconds(), r.gpu, r.ok) for r in recorded)


def test_gpu_samples_start_when_the_run_does(cluster: Cluster, node: NodeConnection) -> None:
    samples = sampled_from_running(cluster, NodeLayout("gpu-job"))
    assert {gpu for _, gpu, _ in samples} == {0, 1} and all(ok for *_, ok in samples), samples
    # nvidia-smi's first record, not the check an interval later that would have kept it
    assert [at for at, gpu, _ in samples if gpu == 0][0] <= 1.5, samples
    assert [at for at, gpu, _ in samples if gpu == 1][0] <= 1.5, samples


def test_cpu_samples_start_when_the_run_does(cluster: Cluster, node: NodeConnection) -> None:
    layout = NodeLayout("busy-job")
    node.run("rm -f bin/nvidia-smi")  # a CPU node: the job's own CPU use is read
    start_session(node, layout.run_dir, "busy", "/bin/bash", "-c", "while :; do :; done")
    try:
        samples = sampled_from_running(cluster, layout)
    finally:
        node.run(f"kill -9 -- -$(cat {layout.run_dir}/pid) 2>/dev/null; true")
    assert samples and {gpu for _, gpu, _ in samples} == {CPU_KEY}, samples  # no phantom GPU
    at, _, known = samples[0]
    # the first rate covers the run from its first check on, and is drawn from there
    assert known and at <= 1.5, samples
