"""What job code can do to its node's guard: lift no limit, and lead its writes nowhere.

Job code runs as the login user, who owns the job's folders on the node, `lease.json` and
the guard's reports among them. First on real local nodes (loopback, their guard armed at
launch by the provider, the run started as orch starts it, no controller): a run that
rewrites its lease, or leaves a symlink where the guard writes, is still stopped at its
max_runtime and the node powers itself off. Local nodes run everything as the user who runs
orch, root here, so last the arrangement of an EC2 node: the guard as root, the job's home
and its code as another user (`nobody`), through `setpriv`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.config import LocalSettings, Settings
from orchestrator.control.run.attempt import start_on_nodes
from orchestrator.node.guard_protocol import GuardLayout, GuardTerms, guard_program
from orchestrator.node.launch import ClusterLaunch
from orchestrator.providers.base import LaunchRequest, NodeEnd
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.remote.keys import ensure_identity
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "trust-1"
LIMIT_S = 20.0  # max_runtime from the launch: the run starts well before, on a loaded machine too
FAR = 4_000_000_000  # 2096
LIFTED = json.dumps({"job_id": JOB, "renewed_at": FAR, "runtime_deadline": FAR, "lease_until": FAR})


def terms(limit_s: float = LIMIT_S) -> GuardTerms:
    return GuardTerms(
        job_id=JOB, interval_s=0.5, silence_s=1.0, allowance_s=600.0, deadman_s=None,
        stop_grace_s=1.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        runtime_deadline=datetime.now(UTC) + timedelta(seconds=limit_s),
    )  # fmt: skip


@contextmanager
def running(home: Path, job_code: str) -> Iterator[tuple[LocalProvider, str]]:
    """One local node whose guard was armed at launch with `terms()` and the job's key,
    running `job_code` as its run; yields the provider and the node's id."""
    settings = Settings(home=home, local=LocalSettings(network="loopback"))
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(JOB), "test")
    [instance] = provider.launch(
        LaunchRequest(
            job_id=JOB, cluster=JOB, count=1, gpus_per_node=1, public_key=identity.public_key,
            guard=replace(terms(), lease_key=identity.public_key),
        )
    )  # fmt: skip
    cluster = Cluster([instance], identity, connect_timeout=5)
    try:
        cluster.head.run(f"mkdir -p orch-jobs/{JOB}/workdir")  # as a sync leaves it
        start_on_nodes(
            cluster,
            ClusterLaunch(
                job_id=JOB, run=job_code, setup=None, num_nodes=1, procs_per_node=1,
                master_addr="127.0.0.1", master_port=29500, node_ips=["127.0.0.1"],
                checkpoint_dir=f"orch-jobs/{JOB}/checkpoints", launcher="none",
            ),
        )  # fmt: skip
        yield provider, instance.instance_id
    finally:
        cluster.close()
        provider.terminate([instance.instance_id])


def powered_off(provider: LocalProvider, iid: str) -> NodeEnd:
    """How the node ended itself; fails if it still runs a while after its limit."""
    return wait_until(
        lambda: provider.self_ended([iid]).get(iid),
        "the node's guard to power it off at max_runtime",
        timeout=LIMIT_S + 30,
    )


def test_job_code_that_rewrites_its_lease_is_still_stopped_at_max_runtime(
    tmp_path: Path,
) -> None:
    lease = f'"$HOME"/{GuardLayout(JOB).lease}'
    ran = tmp_path / "ran"
    job_code = f"while :; do printf '%s' '{LIFTED}' > {lease} && touch {ran}; sleep 0.2; done"
    with running(tmp_path / "orch", job_code) as (provider, iid):
        end = powered_off(provider, iid)
    assert end.kind == "max_runtime", end
    assert ran.exists(), "the job code never ran"


def test_a_symlink_where_the_guard_writes_its_decision_leads_it_nowhere(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.chown(victim, 12345, 12345)
    folder = f'"$HOME"/{GuardLayout(JOB).root}'
    job_code = (
        f"for name in decision.json decision.json.tmp status.json.tmp; do "
        f"ln -sf {victim} {folder}/$name; done; touch {tmp_path}/ran; sleep 1000"
    )
    with running(tmp_path / "orch", job_code) as (provider, iid):
        end = powered_off(provider, iid)
    assert end.kind == "max_runtime", end
    assert (tmp_path / "ran").exists(), "the job code never ran"
    assert victim.read_text() == "precious"
    assert (victim.stat().st_uid, victim.stat().st_gid) == (12345, 12345)


# --- the guard as root, the job as another user -----------------------------------------------

NOBODY = 65534


@pytest.fixture
def machine() -> Iterator[Path]:
    """A folder every user can pass through (pytest's own is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="orch-guard-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(command: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "sh", "-c", command]  # fmt: skip


def test_a_root_guard_over_another_users_job_keeps_its_limit_and_its_writes_its_own(
    machine: Path,
) -> None:
    """As on EC2: the guard runs as root from a folder of root's; the job's home and its code
    are another user's. That user, before and while the guard runs, points the guard's report
    files at a file of root's and rewrites the lease. The file of root's stays as it was, the
    reports are plain files of the user's, the guard keeps its own state in a 0700 folder of
    root's, and the run is still stopped at its limit."""
    program, home = machine / "opt", machine / "home"
    program.mkdir(mode=0o755)
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY, NOBODY)
    victim = machine / "victim"
    victim.write_text("root's own")
    victim.chmod(0o600)
    for name, text in guard_program().items():
        (program / name).write_text(text)
    key = ensure_identity(machine / "keys", "test")
    poweroff = machine / "powered-off"
    (program / "terms.json").write_text(
        replace(terms(limit_s=4.0), lease_key=key.public_key).for_node(
            now=datetime.now(UTC), hourly_usd=Decimal(1), poweroff=f"touch {poweroff}",
            home=str(home),
        )
    )  # fmt: skip
    guard_dir = home / GuardLayout(JOB).root
    run_dir = home / "orch-jobs" / JOB / "run"
    planted = " && ".join(
        f"ln -s {victim} {guard_dir}/{name}"
        for name in ("status.json", "status.json.tmp", "decision.json.tmp")
    )
    subprocess.run(
        as_nobody(f"mkdir -p {guard_dir} {run_dir} && {planted} "
                  f"&& printf '%s' '{LIFTED}' > {guard_dir}/lease.json"),
        check=True,
    )  # fmt: skip
    run = subprocess.Popen(as_nobody("exec sleep 1000"), start_new_session=True)
    (run_dir / "pid").write_text(f"{run.pid}\n")
    guard = subprocess.Popen(
        # as its systemd unit starts it: the folder, run as the runtime's zipapp is
        [sys.executable, "-u", str(program), "guard", str(program / "terms.json")],
        cwd=machine, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(poweroff.exists, "the root guard to act at max_runtime", timeout=30)
        assert run.wait(timeout=10) == -signal.SIGTERM
    finally:
        guard.kill()
        said, _ = guard.communicate()
        run.kill()
        run.wait()
    assert "ignored guard/lease.json: it is not signed" in said, said
    assert victim.read_text() == "root's own"
    assert (victim.stat().st_uid, stat.S_IMODE(victim.stat().st_mode)) == (0, 0o600)
    for name in ("status.json", "decision.json"):
        report = guard_dir / name
        assert not report.is_symlink() and report.lstat().st_uid == NOBODY
    assert json.loads((guard_dir / "decision.json").read_text())["kind"] == "max_runtime"
    state = program / "state"
    assert (state.stat().st_uid, stat.S_IMODE(state.stat().st_mode)) == (0, 0o700)
    assert json.loads((state / "decision.json").read_text())["kind"] == "max_runtime"
