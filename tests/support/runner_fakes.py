"""The runner's test fakes: a provider whose instances exist only in memory, attempts that
open no SSH, a checkpoint keeper that keeps nothing, and a scripted supervisor; with a real
ledger (the `ledger` fixture of tests/conftest.py), a test drives `JobRunner` down any path
and reads what it left in the ledger and asked of the provider. `FakeAttempt.opened` lists
the attempts opened since the test began.

A test module takes the fixtures by importing them: `fresh_attempts` (autouse: empties
`FakeAttempt.opened` before each test) and `fake_provider` (the `provider` fixture: a
`FakeProvider` on the test's ledger)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.cluster.checkpoints.keeper import CheckpointKeeper, Resume
from orchestrator.cluster.checkpoints.kept_summary import Kept, newest_kept
from orchestrator.cluster.connections import Cluster
from orchestrator.config import Settings
from orchestrator.control.money.stop_rules import StopOrder
from orchestrator.control.run.attempt import Answer, Attempt
from orchestrator.control.run.options import RunnerOptions, SilentReporter
from orchestrator.control.run.recovery_rules import Interruption
from orchestrator.control.run.runner import JobRunner
from orchestrator.control.run.watching import Verdict
from orchestrator.errors import CapacityError
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, utcnow
from orchestrator.node import launch
from orchestrator.providers.base import (
    CloudIdentity,
    Instance,
    LaunchRequest,
    NodeEnd,
)
from orchestrator.remote.keys import Identity
from orchestrator.spec.model import JobSpec, LoadedJob

JOB_ID = "unit-1"
FAST = RunnerOptions(stop_grace=0.0, final_pull_wait=0.0, launch_retries=0, launch_backoff=0.0)


# --- fakes ------------------------------------------------------------------------------------
@dataclass
class FakeProvider:
    """Launches instances that exist only here; `capacity` False refuses every launch."""

    ledger_id: str
    name: str = "fake"
    capacity: bool = True
    price: Decimal = Decimal("3.60")
    launched_ago: timedelta = timedelta(0)
    running: dict[str, Instance] = field(default_factory=dict)
    requests: list[LaunchRequest] = field(default_factory=list)
    terminated: list[list[str]] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)

    def launch(self, request: LaunchRequest) -> list[Instance]:
        self.requests.append(request)
        if not self.capacity:
            raise CapacityError("no capacity for the fake nodes")
        launched = [
            Instance(
                instance_id=f"f-{len(self.requests)}-{rank}",
                job_id=request.job_id,
                cluster=request.cluster,
                rank=rank,
                private_ip=f"10.0.0.{rank + 1}",
                ssh_host="127.0.0.1",
                ssh_port=22,
                ssh_user="orch",
                host_key="ssh-ed25519 K",
                interface="lo",
                market="spot" if request.spot is True else "on-demand",
                instance_type="fake.gpu",
                price_per_hour=self.price,
                launched_at=utcnow() - self.launched_ago,
                zone=f"zone-{rank}",
                ledger_id=self.ledger_id,
            )  # fmt: skip
            for rank in request.node_ranks
        ]
        self.running.update({i.instance_id: i for i in launched})
        return launched

    def terminate(self, instance_ids: list[str]) -> datetime:
        self.terminated.append(sorted(instance_ids))
        for instance_id in instance_ids:
            self.running.pop(instance_id, None)
        return utcnow()

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        return [i for i in self.running.values() if job_id in (None, i.job_id)]

    def identity(self) -> CloudIdentity:
        return CloudIdentity(provider="fake", account="unit")

    def preempted(self, instance_ids: list[str]) -> set[str]:
        return self.taken & set(instance_ids)

    def self_ended(self, instance_ids: list[str]) -> dict[str, NodeEnd]:
        return {}

    def take(self, instance_id: str) -> None:
        """The cloud reclaims a node."""
        self.taken.add(instance_id)
        self.running.pop(instance_id, None)


class FakeWatch:
    def __init__(self, nodes: int) -> None:
        self.misses = [0] * nodes
        self.caught_up = 0

    def catch_up(self, *, skip: Collection[int] = ()) -> None:
        self.caught_up += 1


class FakeAttempt(Attempt):
    """An attempt on nodes nothing connects to: every command succeeds at once."""

    opened: list[FakeAttempt] = []

    def __init__(self, instances: list[Instance]) -> None:
        super().__init__(instances, cast(Cluster, object()))
        self.stops: list[float] = []
        self.pushes = 0
        FakeAttempt.opened.append(self)

    def push(
        self,
        loaded: LoadedJob,
        layout: launch.NodeLayout,
        *,
        low_priority: bool = False,
        timeout: float | None = None,
    ) -> int:
        self.pushes += 1
        self.low_priority = low_priority
        self.push_timeout = timeout
        return len(self.instances)

    def free_port(self) -> int:
        return 29500

    def clear_runs(self, layout: launch.NodeLayout, ranks: Collection[int]) -> None:
        self.cleared = [*getattr(self, "cleared", []), *ranks]

    def start(self, cluster_launch: launch.ClusterLaunch) -> list[str]:
        self.launch = cluster_launch
        self.started = True
        return [str(1000 + i.rank) for i in self.instances]

    def read(self, command: str) -> list[str]:
        return []

    def each_node(
        self, command: str, stdin: Callable[[int], str] | None = None
    ) -> dict[int, Answer]:
        return {}

    def stop_trainers(self, layout: launch.NodeLayout, grace_s: float) -> None:
        self.stops.append(grace_s)

    def log_tail(self, rank: int, layout: launch.NodeLayout) -> str:
        return ""

    def abort(self, rank: int) -> None:
        pass

    def close(self) -> None:
        pass


def open_fake(instances: list[Instance], identity: Identity, connect_timeout: float) -> Attempt:
    return FakeAttempt(instances)


class FakeKeeper:
    """Checkpoints nobody writes: nothing to resume from, every pull returns at once. With a
    `ledger`, what it keeps (`kept`) is what the ledger's live records of the job say, as the
    real keeper's is."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.finished: list[tuple[set[int], float]] = []
        self.adopted = 0
        self.ledger = ledger

    def prepare(self, cluster: object, **access: object) -> Resume:
        return Resume("", None)

    def adopt(self, cluster: object, **access: object) -> None:
        self.adopted += 1

    def finish(self, *, skip: Collection[int] = (), wait_s: float = 60.0) -> None:
        self.finished.append((set(skip), wait_s))

    def newest(self) -> None:
        return None

    def kept(self) -> list[Kept]:
        if self.ledger is None:
            return []
        return newest_kept(self.ledger.checkpoints(JOB_ID, live_only=True))

    def sweep_store(self) -> None:
        pass

    def node_gone(self, rank: int) -> None:
        pass

    def watch(self, *args: object, **kwargs: object) -> None:
        pass

    def stop_watching(self) -> None:
        pass


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def fresh_attempts() -> None:
    """No attempt opened before the test counts in `FakeAttempt.opened`."""
    FakeAttempt.opened = []


@pytest.fixture(name="provider")
def fake_provider(ledger: Ledger) -> FakeProvider:
    """A `FakeProvider` on the test's ledger (the `ledger` fixture)."""
    return FakeProvider(ledger.ledger_id)


# --- set-up -----------------------------------------------------------------------------------
def loaded_job(tmp_path: Path, **fields: Any) -> LoadedJob:
    spec = JobSpec.model_validate(
        {"name": "unit", "workdir": ".", "run": "true", "resources": {"nodes": 2}, **fields}
    )
    return LoadedJob(spec, tmp_path / "job.yaml", tmp_path, tmp_path, [])


def add_job(ledger: Ledger, loaded: LoadedJob) -> Job:
    spec = loaded.spec
    return ledger.add_job(
        Job(
            id=JOB_ID, name=spec.name, provider="fake", nodes=spec.resources.nodes,
            gpus_per_node=spec.resources.gpus_per_node, spec_json=spec.model_dump_json(),
            spec_path="job.yaml", created_at=utcnow(),
        )
    )  # fmt: skip


Supervise = Callable[[Attempt], Verdict]


def scripted(*decisions: Verdict) -> Supervise:
    """A supervisor that hands back `decisions` in turn, one per started run."""
    left = list(decisions)

    def supervise(attempt: Attempt) -> Verdict:
        assert attempt.running, "supervised before the run was started"
        attempt.watch = cast(Any, FakeWatch(len(attempt.instances)))
        return left.pop(0)

    return supervise


def lose_node_1_then_succeed(
    provider: FakeProvider, then: Callable[[], None] = lambda: None
) -> Supervise:
    """A supervisor whose first run loses node 1 (the cloud takes it; `then` runs after) and
    whose second run succeeds."""

    def lost(attempt: Attempt) -> Verdict:
        gone = attempt.instances[1]
        provider.take(gone.instance_id)
        attempt.gone_ranks.add(1)
        then()
        return Interruption((1,), (gone.instance_id,), "lost", "stopped answering", utcnow())

    return in_turn(lost, scripted(StopOrder(JobState.SUCCEEDED, 0, "")))


def in_turn(*supervises: Supervise) -> Supervise:
    """One supervisor per started run, in turn."""
    calls = list(supervises)

    def supervise(attempt: Attempt) -> Verdict:
        attempt.watch = cast(Any, FakeWatch(len(attempt.instances)))
        return calls.pop(0)(attempt)

    return supervise


def runner(
    tmp_path: Path,
    ledger: Ledger,
    provider: FakeProvider,
    supervise: Supervise,
    options: RunnerOptions = FAST,
    keeper: FakeKeeper | None = None,
    driver: object = None,
    **spec_fields: Any,
) -> JobRunner:
    loaded = loaded_job(tmp_path, **spec_fields)
    try:
        job = ledger.get_job(JOB_ID)
    except Exception:
        job = add_job(ledger, loaded)
    return JobRunner(
        job,
        loaded,
        settings=Settings(home=tmp_path / "orch"),
        ledger=ledger,
        provider=provider,  # type: ignore[arg-type]
        reporter=SilentReporter(),
        options=options,
        open_attempt=open_fake,
        keeper=cast(CheckpointKeeper, keeper or FakeKeeper()),
        supervise=supervise,
        driver=cast(Any, driver),
    )


def killed_while_running(
    tmp_path: Path, ledger: Ledger, provider: FakeProvider, *, claimed: bool = False
) -> None:
    """The job brought up to RUNNING by a controller that then died: no teardown, its nodes,
    leases and ledger rows left as they were. `claimed`: it had claimed the cloud identity."""
    killed = runner(tmp_path, ledger, provider, scripted())
    if claimed:
        killed.launcher.claim_identity()
    killed.bring_up.start()


def kinds(ledger: Ledger) -> list[str]:
    return [event.kind for event in ledger.events(JOB_ID)]


def assert_all_leases_closed(ledger: Ledger, provider: FakeProvider) -> None:
    leases = ledger.leases(JOB_ID)
    assert leases, "no lease was opened"
    assert all(lease.ended_at is not None for lease in leases)
    assert not provider.running
