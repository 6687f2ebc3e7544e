"""Caps from launch: a node bills from its boot, so its guard holds max_runtime and the budget
lease from then, before any code is synced; and the controller's pushes end.

On real local nodes (loopback, their guard armed at launch by the provider) and real rsync:

- the controller's push to a node hangs (its process frozen mid-transfer, as a controller that
  died or a network that went silent leaves it): the rsync on the node waits for ever, moving
  nothing. It holds the dead-man off only while it moves data; the guard stops the node at
  max_runtime, or when its budget lease runs out, though the run never started;
- a push that does not finish within the controller's push timeout is stopped, and the error
  names the transfer, the timeout and the setting that sets it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster, host_address
from orchestrator.config import LocalSettings, Settings
from orchestrator.control.run.attempt import Attempt
from orchestrator.errors import TransferTimeout
from orchestrator.node.guard_protocol import GuardTerms
from orchestrator.node.launch import NodeLayout
from orchestrator.providers.base import Instance, LaunchRequest
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import Identity, ensure_identity
from orchestrator.remote.sync import push_argv
from orchestrator.spec.model import JobSpec, LoadedJob
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "caps-1"
LIMIT_S = 8.0  # from the launch
PRICE = Decimal(36)  # USD per node-hour: a cent a second


def terms(limit: str) -> GuardTerms:
    """A guard whose dead-man is far off (10 min): only `limit` can stop the node soon."""
    base = GuardTerms(
        job_id=JOB, interval_s=0.5, silence_s=2.0, allowance_s=600.0, deadman_s=600.0,
        stop_grace_s=1.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        stop_allowance_s=0.0,
    )  # fmt: skip
    if limit == "max_runtime":
        deadline = datetime.now(UTC) + timedelta(seconds=LIMIT_S)
        return replace(base, runtime_deadline=deadline)
    # 8 cents at a cent a second, less the second kept back for the stop's grace
    return replace(base, budget_left_usd=PRICE * Decimal(LIMIT_S + 1) / 3600)


@contextmanager
def node(
    home: Path, guard: GuardTerms | None
) -> Iterator[tuple[LocalProvider, Instance, Identity]]:
    settings = Settings(home=home, local=LocalSettings(network="loopback", price_per_hour=PRICE))
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(JOB), "test")
    [instance] = provider.launch(
        LaunchRequest(job_id=JOB, cluster=JOB, count=1, gpus_per_node=1,
                      public_key=identity.public_key, guard=guard)
    )  # fmt: skip
    try:
        yield provider, instance, identity
    finally:
        provider.terminate([instance.instance_id])


def node_rsyncs(home: str) -> list[int]:
    """Pids of the rsyncs that write into the node's `home` (the push's far end)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or Path(f"/proc/{entry}/comm").read_text().strip() != "rsync":
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HOME={home}".encode() in env:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("limit", ["max_runtime", "budget"])
def test_a_node_whose_sync_hangs_is_stopped_at_its_limit_before_the_run_starts(
    tmp_path: Path, limit: str
) -> None:
    data = tmp_path / "data.bin"
    with data.open("wb") as handle:
        handle.truncate(2 * 1024**3)  # far more than the push sends before it is frozen
    with node(tmp_path / "orch", terms(limit)) as (provider, instance, identity):
        launched = time.time()
        Cluster([instance], identity).close()  # pins the node's host key for rsync
        home = str(provider.store.node_dir(instance.instance_id) / "disk")
        argv = push_argv(data, host_address(instance), identity, "~/data.bin")
        push = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_until(lambda: node_rsyncs(home), "the push to reach the node", 30)
            os.killpg(push.pid, signal.SIGSTOP)  # the controller hangs mid-transfer
            end = wait_until(
                lambda: provider.self_ended([instance.instance_id]).get(instance.instance_id),
                f"the node's guard to stop it at its {limit}",
                timeout=LIMIT_S + 40,
            )
        finally:
            os.killpg(push.pid, signal.SIGKILL)
            push.wait()
        ended = end.at.timestamp() if end.at else time.time()
    assert end.kind == limit, end
    # The limit, plus the guard's silence for the frozen transfer and a look or two.
    assert ended - launched < LIMIT_S + 15, ended - launched
    run = tmp_path / "orch" / "local"
    assert not list(run.rglob(f"orch-jobs/{JOB}/run/pid")), "the run started"


def test_a_push_past_its_timeout_is_stopped_with_an_error_naming_the_setting(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hi')\n")
    spec = JobSpec.model_validate({"name": "caps", "workdir": ".", "run": "python train.py"})
    loaded = LoadedJob(spec, tmp_path / "job.yaml", workdir, workdir, [])
    with node(tmp_path / "orch", None) as (provider, instance, identity):
        sshd = int((provider.store.node_dir(instance.instance_id) / "sshd.pid").read_text())
        attempt = Attempt([instance], Cluster([instance], identity, connect_timeout=5))
        os.kill(sshd, signal.SIGSTOP)  # the node answers the connection, then nothing
        started = time.monotonic()
        try:
            with pytest.raises(TransferTimeout) as caught:
                attempt.push(loaded, NodeLayout(JOB), timeout=1.5)
        finally:
            os.kill(sshd, signal.SIGCONT)
            attempt.close()
        took = time.monotonic() - started
    assert took < 8, took  # stopped at its timeout, not when ssh gives up
    error = caught.value
    assert "workdir ->" in error.message and "did not finish within 1.5 s" in error.message
    assert error.hint is not None and "controller.push_timeout" in error.hint
    assert "ORCH_PUSH_TIMEOUT" in error.hint
