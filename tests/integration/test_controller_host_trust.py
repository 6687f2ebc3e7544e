"""What a controller host may do, and what is done to it, on real local nodes:

- `orch controller up` leaves a host that its provider reports running alone when only SSH
  fails (its sshd stopped), says why, and exits non-zero; `--force` replaces it and says what
  it ends;
- a `--remote` job's inline secret is in no file of the host's home once the job ended, orch's
  folders there are 0700, the job carries the laptop's owner, and a host that answers
  `../../x` as a job id gets nothing written on the laptop;
- the host's dead-man: an idle host whose `orch status` fails from its daemon's start stops
  all the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.host import record as records
from orchestrator.providers.local.provider import LocalProvider
from tests.support.controller_host import AdoptableNode, adoptable_node, node_cmdlines
from tests.support.helpers import (
    counter_run,
    counter_workdir,
    fast_env,
    job_json,
    processes_with_marker,
    run_orch,
)
from tests.support.waiting import wait_until

SECRET = "inline-s3cr3t-never-on-the-host-4b9e"
LAPTOP_USER = "laptop-owner"
# The job's own check that the secret reached it, without its value in the spec.
HAS_SECRET = (
    'test "$(printf %s "$INLINE_TOKEN" | sha256sum | cut -c1-16)" = '
    f"{hashlib.sha256(SECRET.encode()).hexdigest()[:16]}"
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[AdoptableNode]:
    with adoptable_node(tmp_path, tick_s="1") as adoptable:
        yield adoptable


def test_up_leaves_a_running_host_whose_ssh_is_stopped_and_force_replaces_it(
    tmp_path: Path,
) -> None:
    env = fast_env(tmp_path / "orch", ORCH_HOST_TICK="1")
    home = Path(env["ORCH_HOME"])
    first = run_orch(["controller", "up", "--provider", "local", "--autostop", "0", "--json"],
                     env, timeout=120)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    iid = json.loads(first.stdout)["instance_id"]
    provider = LocalProvider(load_settings(env))
    sshd = provider.store.load(iid).sshd_pid
    assert sshd is not None
    try:
        os.kill(sshd, signal.SIGSTOP)  # the machine runs; its SSH does not answer
        refused = run_orch(["controller", "up", "--json"], env, timeout=120)
        assert refused.returncode != 0, refused.stdout + refused.stderr
        said = refused.stderr
        assert "is not replaced" in said and "(timeout:" in said, said
        assert f"its provider reports its node {iid} running" in said, said
        assert "--force" in said and "is terminated" in said, said
        assert provider.store.load(iid) is not None and processes_with_marker(iid), "host ended"
        assert records.load(home) is not None and records.load(home).instance_id == iid

        forced = run_orch(["controller", "up", "--force", "--json"], env, timeout=180)
        assert forced.returncode == 0, forced.stdout + forced.stderr
        document = json.loads(forced.stdout)
        assert document["replaced"]["terminated"] == iid and document["instance_id"] != iid
        assert "--force: replacing the controller host" in forced.stderr, forced.stderr
        assert f"its node {iid} is terminated" in forced.stderr, forced.stderr
        assert processes_with_marker(iid) == [] and provider.store.load(iid) is None
    finally:
        with suppress(ProcessLookupError):
            os.kill(sshd, signal.SIGCONT)
        run_orch(["controller", "down", "--force"], env, timeout=120)
        provider.terminate([i.instance_id for i in provider.list_owned()])


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every regular file under `root` (links not followed) whose bytes hold `needle`."""
    found = []
    for path in root.rglob("*"):
        with suppress(OSError):
            if stat.S_ISREG(path.lstat().st_mode) and needle in path.read_bytes():
                found.append(str(path))
    return found


def laptop_tree(root: Path) -> list[str]:
    """The paths under `root`, but the local provider's nodes (`orch/local`: the cloud, the
    host among them), which are not the laptop's."""
    paths = (str(p.relative_to(root)) for p in root.rglob("*"))
    return sorted(p for p in paths if not p.startswith("orch/local"))


def test_a_remote_job_leaves_no_secret_on_the_host_whose_folders_are_private(
    tmp_path: Path, node: AdoptableNode
) -> None:
    env = {**node.env, "LOGNAME": LAPTOP_USER, "USER": LAPTOP_USER}  # not the host's user
    up = run_orch(node.up_args("0"), env, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    counter_workdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: inline-secret\nworkdir: work\nresources: {nodes: 1, gpus_per_node: 1}\n"
        f"run: {counter_run(3, step_s=0.3)} && {HAS_SECRET}\n"
        f"secrets: {{INLINE_TOKEN: {SECRET}}}\n"
    )
    submitted = run_orch(["submit", str(spec), "--remote"], env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]

    def ended() -> dict | None:
        job = job_json(job_id, env)
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    job = wait_until(ended, f"{job_id} to end", 90, interval=1)
    assert job["state"] == "SUCCEEDED", json.dumps(job.get("events"))[-3000:]  # it had it
    disk = node.root.parent  # the host's whole home
    holding: list[list[str]] = [[]]

    def cleared() -> bool:
        holding[0] = files_holding(disk, SECRET.encode())
        return not holding[0]

    with suppress(AssertionError):
        wait_until(cleared, "the host to remove the job's secrets file", 20, interval=0.5)
    assert holding[0] == [], "the secret is in files of the host"
    assert list((node.root / "submissions").iterdir()) == [], "a submission outlived its job"

    made_by_orch = [node.root, *(p for p in node.root.rglob("*") if p.is_dir()
                                 and not p.is_symlink())]  # fmt: skip
    loose = [f"{p} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in made_by_orch
             if p.stat().st_mode & 0o077]  # fmt: skip
    assert loose == [], "folders of orch on the host that others may enter"

    with sqlite3.connect(node.root / "home" / "orch.db") as db:
        (owner,) = db.execute("select owner from job where id = ?", (job_id,)).fetchone()
    assert owner == LAPTOP_USER, "the job carries the host's login user"

    # A host whose orch answers `../../x` as the job id gets nothing written here.
    real = node.root / "venv/bin/orch"
    real.rename(real.with_name("orch.real"))
    real.write_text('#!/bin/sh\nif [ "$1" = submit ]; then echo ../../x; exit 0; fi\n'
                    'exec "$(dirname "$0")/orch.real" "$@"\n')  # fmt: skip
    real.chmod(0o700)
    before = laptop_tree(tmp_path)
    hostile = run_orch(["submit", str(spec), "--remote"], env, timeout=120)
    assert hostile.returncode != 0 and "not a job id" in hostile.stderr, hostile.stderr
    assert laptop_tree(tmp_path) == before, "the host's answer wrote something on the laptop"
    assert job_id in records.require(node.home).jobs and "../../x" not in str(
        records.require(node.home).jobs
    )
    # A host whose orch answers a request about one job with another's document is refused.
    other = '{"document": {"id": "other-0a0a0a", "state": "RUNNING"}}'
    real.write_text(f'#!/bin/sh\nif [ "$1 $2" = "controller answer" ]; then echo \'{other}\'; '
                    'exit 0; fi\nexec "$(dirname "$0")/orch.real" "$@"\n')  # fmt: skip
    lied = run_orch(["status", job_id, "--json"], env, timeout=60)
    assert lied.returncode == 3 and "describes job 'other-0a0a0a'" in lied.stderr, lied
    assert lied.stdout == "", "a refused answer is shown"
    down = run_orch(["controller", "down", "--json"], env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr


def test_an_idle_host_whose_orch_status_fails_stops_all_the_same(node: AdoptableNode) -> None:
    env = {**node.env, "ORCH_HOST_DEADMAN": "2"}
    up = run_orch(node.up_args("6s"), env, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    # The host's orch can no longer list its jobs, and its daemon starts again blind.
    (node.root / "home" / "config.yaml").write_text("ledger: [not, settings\n")
    os.kill(int((node.root / "daemon.pid").read_text()), signal.SIGKILL)
    iid = node.instance.instance_id

    def stopped() -> bool:
        return not node_cmdlines(iid, "orchestrator.host.daemon") and not node_cmdlines(
            iid, "supervise.sh"
        )

    wait_until(stopped, "the blind host's daemon and supervisor to stop", timeout=30)
    log = (node.root / "daemon.log").read_text()
    assert "orch status failed" in log and "dead-man 2 s" in log and "stopping" in log, log
    assert (node.root / "stop").exists()
    down = run_orch(["controller", "down", "--force", "--json"], env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
