"""`JobActivity.tick`: GPU readings (or CPU use without GPUs) of every node -> the idle clock
and the samples kept in the ledger. Fake watchers stand in for nvidia-smi over SSH; the pure
idle policy and downsampler are the real ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from orchestrator.cluster.activity import CPU_KEY, ActivityThresholds, JobActivity
from orchestrator.ledger.store import GpuSampleRecord
from orchestrator.node.gpu import GpuSample, NodeGpuState
from orchestrator.node.launch import NodeLayout


@dataclass
class FakeGpu:
    """What `GpuWatcher.latest` would return, set by the test."""

    state: NodeGpuState = field(default_factory=lambda: NodeGpuState(available=None))
    started: bool = False
    stopped: bool = False
    gpu_indices: tuple[int, ...] | None = None  # the node's share of the machine's GPUs

    def latest(self, now: float) -> NodeGpuState:
        return self.state

    def wait_answer(self, timeout_s: float) -> bool:
        return self.state.available is not None

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


@dataclass
class FakeCpu:
    percent: float | None = None
    error: str | None = None  # why the last sample was unknown, as CpuWatcher says
    since: float | None = None  # when the use the last sample returned began
    last_at: float | None = None

    def sample(self, now: float) -> float | None:
        if self.percent is not None or self.error is None:  # a good reading
            self.since, self.last_at = self.last_at, now
        return self.percent


def gpus(at: float, *utils: float | None) -> NodeGpuState:
    samples = tuple(
        GpuSample(i, f"GPU-{i}", u, 100.0, 80_000.0, u is not None) for i, u in enumerate(utils)
    )
    return NodeGpuState(available=True, samples=samples, updated_at=at)


def activity(
    nodes: int, *, idle_timeout_s: float | None = 60.0, sample_every: float = 10.0
) -> tuple[JobActivity, list[FakeGpu], list[FakeCpu], list[GpuSampleRecord]]:
    recorded: list[GpuSampleRecord] = []
    watch = JobActivity(
        "job-1",
        SimpleNamespace(connections=[], instances=[]),  # type: ignore[arg-type]  # no node: fakes below
        NodeLayout("job-1"),
        interval_s=1.0,
        gpus_per_node=2,
        idle_timeout_s=idle_timeout_s,
        thresholds=ActivityThresholds(sample_every=sample_every),
        record=recorded.extend,
    )
    fake_gpus = [FakeGpu() for _ in range(nodes)]
    fake_cpus = [FakeCpu() for _ in range(nodes)]
    watch.gpus, watch.cpus = fake_gpus, fake_cpus  # type: ignore[assignment]
    return watch, fake_gpus, fake_cpus, recorded


def test_the_idle_clock_starts_when_every_gpu_went_idle_and_one_busy_gpu_resets_it() -> None:
    watch, fake_gpus, _, _ = activity(2)
    for gpu in fake_gpus:
        gpu.state = gpus(100.0, 0.0, 1.0)
    assert watch.tick(now=100.5) == 0.5  # from when the GPUs read idle, not from the tick
    for gpu in fake_gpus:
        gpu.state = gpus(130.0, 0.0, 1.0)
    assert watch.tick(now=130.5) == 30.5
    fake_gpus[1].state = gpus(131.0, 0.0, 90.0)  # one GPU of one node is enough
    assert watch.tick(now=131.5) == 0.0
    assert watch.what == "every GPU"


def test_unknown_readings_never_count_as_idle() -> None:
    watch, fake_gpus, _, _ = activity(1)
    fake_gpus[0].state = gpus(10.0, 0.0, 0.0)
    watch.tick(now=10.0)
    fake_gpus[0].state = NodeGpuState(available=True, samples=(), error="garbage")
    assert watch.tick(now=100.0) == 0.0  # no trusted reading: the clock does not run
    fake_gpus[0].state = gpus(101.0, 0.0, None)  # one GPU unknown, one idle: not idle
    assert watch.tick(now=200.0) == 0.0


def test_a_node_without_nvidia_smi_is_judged_by_its_jobs_cpu_use() -> None:
    watch, fake_gpus, fake_cpus, recorded = activity(1, sample_every=1.0)
    fake_gpus[0].state = NodeGpuState(available=False, error="nvidia-smi: not found")
    fake_cpus[0].percent = 3.0  # below the 10 % threshold
    assert watch.tick(now=50.0) == 0.0
    assert watch.tick(now=80.0) == 30.0
    assert watch.what == "the job's processes (no GPU)"
    fake_cpus[0].percent = 150.0
    assert watch.tick(now=81.0) == 0.0
    assert recorded and {r.gpu for r in recorded} == {CPU_KEY}
    assert all(r.job_id == "job-1" and r.rank == 0 for r in recorded)


def test_samples_are_downsampled_per_gpu_and_the_last_window_is_written_on_stop() -> None:
    watch, fake_gpus, _, recorded = activity(1, sample_every=10.0)
    watch.start()
    assert fake_gpus[0].started
    for t in range(0, 25):
        fake_gpus[0].state = gpus(float(t), 40.0, 60.0)
        watch.tick(now=float(t))
    windows = len(recorded)
    assert windows >= 2 and {r.gpu for r in recorded} == {0, 1}
    watch.stop()
    assert fake_gpus[0].stopped and len(recorded) > windows  # the open window is not lost
    by_gpu = {r.gpu: r.util_pct for r in recorded}
    assert by_gpu == {0: 40.0, 1: 60.0}


def test_without_an_idle_timeout_the_clock_runs_for_status_but_never_reaches_a_stop() -> None:
    watch, fake_gpus, _, _ = activity(1, idle_timeout_s=None)
    fake_gpus[0].state = gpus(0.0, 0.0, 0.0)
    watch.tick(now=0.0)
    fake_gpus[0].state = gpus(3600.0, 0.0, 0.0)
    assert watch.tick(now=3600.0) == 3600.0
    assert watch.policy.timeout_s > 10**9


def test_a_node_without_gpus_records_no_gpu_before_nvidia_smi_answers() -> None:
    watch, fake_gpus, fake_cpus, recorded = activity(1, sample_every=1.0)
    watch.start()
    watch.tick(now=10.0)  # nvidia-smi has not answered yet: nothing is known of the GPUs
    watch.tick(now=11.0)
    fake_gpus[0].state = NodeGpuState(available=False, error="nvidia-smi: not found")
    watch.tick(now=12.0)  # the first CPU reading gives no rate yet, and nothing failed
    fake_cpus[0].percent = 150.0
    for t in (13.0, 14.0):
        watch.tick(now=t)
    fake_cpus[0].percent, fake_cpus[0].error = None, "could not read CPU use: timed out"
    watch.tick(now=15.0)  # a reading that failed is recorded as unknown
    watch.stop()
    assert [(r.gpu, r.util_pct, r.ok) for r in recorded] == [
        (CPU_KEY, 150.0, True),
        (CPU_KEY, 150.0, True),
        (CPU_KEY, None, False),
    ]  # no phantom "GPU 0", no unknown first reading


def test_a_short_job_keeps_a_sample_per_watch_interval_for_its_first_minutes() -> None:
    watch, fake_gpus, _, recorded = activity(1, sample_every=30.0)  # watch interval: 1 s
    for t in range(1000, 1060):  # one minute of one tick a second
        fake_gpus[0].state = gpus(float(t), 50.0, 60.0)
        watch.tick(now=float(t))
    watch.stop()
    gpu0 = [r for r in recorded if r.gpu == 0]
    assert len(gpu0) == 60  # one per tick, not two 30 s averages
    late, late_gpus, _, late_recorded = activity(1, sample_every=30.0)
    for t in range(1000, 1000 + 600):  # past the first minutes: one sample per 30 s
        late_gpus[0].state = gpus(float(t), 50.0, 60.0)
        late.tick(now=float(t))
    late.stop()
    assert 300 + 10 <= len([r for r in late_recorded if r.gpu == 0]) <= 300 + 12
