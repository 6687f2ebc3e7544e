"""Shared helpers of the integration and e2e tests: run the real `orch`, inspect the host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator.cli"]
STEP_COUNTER = REPO / "tests" / "fixtures" / "step_counter.py"
HOLD_FILE = "orch-test-go"  # what releases a step counter held at a step (`counter_run`)


def counter_workdir(directory: Path) -> Path:
    """A workdir holding only the step counter (the trainer contract without torch's seconds of
    import per rank), for tests about orch rather than about training; returns it."""
    work = directory / "work"
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(STEP_COUNTER, work / STEP_COUNTER.name)
    return work


def counter_run(
    steps: int,
    *,
    step_s: float = 0.25,
    checkpoint_every: int = 4,
    stop_s: float = 0.0,
    hold_at: int | None = None,
) -> str:
    """The job spec's `run` for the step counter in a `counter_workdir`; with `hold_at`, every
    rank waits after that step until its node's workdir holds `HOLD_FILE`."""
    run = (
        f"python {STEP_COUNTER.name} --steps {steps} --step-s {step_s} "
        f"--checkpoint-every {checkpoint_every} --stop-s {stop_s}"
    )
    return run if hold_at is None else f"{run} --hold-at {hold_at} --hold-file {HOLD_FILE}"


def install_gpu_stand_in(node_bin: Path, trace: str) -> None:
    """Put the nvidia-smi stand-in (tests/fixtures/nvidia_smi_replay.py) and its `trace` (the
    replay's JSON: mode and GPUs' [util %, MiB used, MiB total]) in `node_bin`, a folder a job
    syncs to `~/bin` of its nodes, first on their PATH."""
    node_bin.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "fixtures" / "nvidia_smi_replay.py", node_bin / "nvidia-smi")
    (node_bin / "nvidia-smi").chmod(0o755)
    (node_bin / "nvidia-smi.trace").write_text(trace)


def orch_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without its ORCH_* variables, with ORCH_HOME=`home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_HOME": str(home), "PYTHONUNBUFFERED": "1", "COLUMNS": "160"})
    env.update(extra)
    return env


# The controller's periodic checks at test speed: the run watch and the notice poll each
# second, the budget every two.
FAST_CHECKS = {
    "ORCH_WATCH_INTERVAL": "1",
    "ORCH_NOTICE_POLL_INTERVAL": "1",
    "ORCH_BUDGET_INTERVAL": "2",
}


def fast_env(home: Path, **extra: str) -> dict[str, str]:
    """`orch_env` with the controller's checks at test speed (`FAST_CHECKS`), then `extra`."""
    return orch_env(home, **{**FAST_CHECKS, **extra})


def run_orch(
    args: Iterable[str], env: dict[str, str], *, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ORCH, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def job_json(job_id: str, env: dict[str, str]) -> dict:
    result = run_orch(["status", job_id, "--json"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def processes_with_marker(marker: str) -> list[int]:
    """Pids whose environment or command line mentions `marker` (e.g. a node's instance id)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in blob:
            found.append(int(entry.name))
    return found


def network_namespaces() -> set[str]:
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in result.stdout.splitlines() if line.strip()}


def assert_nothing_left(job: dict) -> None:
    """No process, namespace or open lease of the job's nodes remains."""
    for lease in job["leases"]:
        instance = lease["instance_id"]
        assert lease["ended_at"] is not None, f"lease of {instance} still open"
        assert processes_with_marker(instance) == [], f"processes of {instance} remain"
        assert not any(instance in ns for ns in network_namespaces()), f"netns of {instance}"


def submitted_job_id(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("job ") and " submitted" in line:
            return line.split()[1]
    raise AssertionError(f"no job id in output:\n{output}")


_LEDGERS: dict[Path, Any] = {}


def job_view(job_id: str, env: dict[str, str]) -> dict:
    """What `orch status JOB --json` prints, built in this process from the same ledger and
    code: polling through the CLI would start a Python of about a CPU-second every time, and
    steal that from the nodes under test. Assertions on the final state use `job_json`."""
    from orchestrator.config import load_settings
    from orchestrator.ledger.store import Ledger, make_engine
    from orchestrator.report.documents import job_document

    settings = load_settings(env)
    if settings.db_path not in _LEDGERS:
        _LEDGERS[settings.db_path] = Ledger(make_engine(settings.db_path))
    ledger = _LEDGERS[settings.db_path]
    document = job_document(ledger, settings, ledger.get_job(job_id))
    return json.loads(json.dumps(document, default=str))


def wait_for_state(
    job_id: str, env: dict[str, str], states: set[str], timeout: float = 180
) -> dict:
    """Poll the job (in-process) until it is in one of `states`; returns `orch status --json`.
    A job that ends in another state fails the wait at once, with its reason and events."""

    def reached() -> bool:
        job = job_view(job_id, env)
        if job["state"] in states:
            return True
        assert job["state"] not in FINAL_STATES, (
            f"{job_id} ended {job['state']} while awaited in {states}: {job.get('reason')}\n"
            + "\n".join(f"{e['at']} {e['kind']} {e['message']}" for e in job["events"])
        )
        return False

    wait_until(reached, f"{job_id} in {states}", timeout, interval=0.5)
    return job_json(job_id, env)


FINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def detach(spec: Path, env: dict[str, str], *flags: str) -> str:
    """Submit `spec` with --detach (and `flags`); returns the job id."""
    result = run_orch(["submit", str(spec), "--detach", *flags], env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


def wait_for(job_id: str, env: dict[str, str], predicate, what: str, timeout: float = 180) -> dict:
    """The job's document (in-process) once `predicate` holds; fails if the job ends first."""

    def ready() -> dict | None:
        job = job_view(job_id, env)
        assert job["state"] not in ("FAILED", "SUCCEEDED"), f"{job_id} ended while {what}: {job}"
        return job if predicate(job) else None

    return wait_until(ready, what, timeout, interval=0.3)


def preempt(job_id: str, env: dict[str, str], node: int, notice: float) -> dict:
    result = run_orch(
        ["local", "preempt", job_id, "--node", str(node), "--notice", str(notice), "--json"],
        env,
        timeout=notice + 60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def events(job: dict, kind: str) -> list[dict]:
    return [e for e in job["events"] if e["kind"] == kind]


def timeline(job: dict, home: Path, *, log_lines: int = 40) -> str:
    """The job's events with their times, then the end of its controller's log: what a test
    that judges how soon something happened prints when it was too late."""
    lines = [f"{e['at']} {e['kind']} {e['message'][:200]}" for e in job["events"]]
    log = home / "jobs" / job["id"] / "controller.log"
    if log.is_file():
        tail = log.read_text(errors="replace").splitlines()[-log_lines:]
        lines += ["--- controller.log ---", *tail]
    return "\n".join(lines)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Background:
    """An orch command run in the background, its output collected by a thread."""

    def __init__(
        self, args: list[str], env: dict[str, str], *, sigint_ignored: bool = False
    ) -> None:
        """`sigint_ignored`: start it as a shell starts a background job, SIGINT ignored."""
        self.proc = subprocess.Popen(
            [*ORCH, *args], env=env, cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 120) -> None:

        def shown() -> bool:
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"{text!r} never appeared:\n{self.output}")
            return False

        try:
            wait_until(
                shown, repr(text), timeout,
                fail=lambda said: AssertionError(f"{said}\n{self.output}"),
            )  # fmt: skip
        except AssertionError:
            self.proc.kill()
            raise

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code


@contextmanager
def loopback_cluster(home: Path, job: str, *, count: int, gpus_per_node: int = 1) -> Iterator:
    """`count` real local nodes on 127.0.0.1 with their connections; always terminated."""
    from orchestrator.cluster.connections import Cluster
    from orchestrator.config import LocalSettings, Settings
    from orchestrator.providers.base import LaunchRequest
    from orchestrator.providers.local.provider import LocalProvider
    from orchestrator.remote.keys import ensure_identity

    settings = Settings(home=home, local=LocalSettings(network="loopback"))
    provider = LocalProvider(settings)
    identity = ensure_identity(settings.keys_dir(job), "test")
    instances = provider.launch(
        LaunchRequest(job_id=job, cluster=job, count=count, gpus_per_node=gpus_per_node,
                      public_key=identity.public_key)
    )  # fmt: skip
    cluster = Cluster(instances, identity, connect_timeout=5)
    try:
        yield cluster
    finally:
        cluster.close()
        provider.terminate([i.instance_id for i in instances])


def assert_nothing_provisioned(home: Path) -> None:
    """A refused submit left no local node, no process naming ORCH_HOME and no lease."""
    nodes = home / "local" / "nodes"
    assert not nodes.exists() or not any(nodes.iterdir())
    assert processes_with_marker(str(home)) == []
    if (home / "orch.db").exists():
        with sqlite3.connect(home / "orch.db") as db:
            assert db.execute("select count(*) from lease").fetchone() == (0,)


def assert_spend_is_leases(job: dict) -> None:
    """Spend is node-seconds x recorded price over every lease, replaced ones included."""
    total = Decimal(0)
    for lease in job["leases"]:
        ended, launched = utc_time(lease["ended_at"]), utc_time(lease["launched_at"])
        seconds = Decimal(str((ended - launched).total_seconds()))
        total += seconds * Decimal(str(lease["price_per_hour"])) / 3600
    assert abs(Decimal(str(job["spend_usd"])) - total) < Decimal("0.000001"), (job, total)


def utc_time(text: str) -> datetime:
    """A time of `orch status --json` (ISO 8601 with its offset)."""
    return datetime.fromisoformat(text)
