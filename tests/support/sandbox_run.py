"""A real `orch sandbox aws` for tests: started as a subprocess, stopped with SIGTERM."""

from __future__ import annotations

import fcntl
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3

from tests.support.helpers import Background, network_namespaces, orch_env

READY_RE = re.compile(r"sandbox ready: (http://127\.0\.0\.1:\d+)")
REGION = "us-east-1"
BRIDGE = "orchsbx0"
NETNS_PREFIX = "osbx-"
# One `orch sandbox aws` per machine (it holds /run/lock/orch-sandbox.lock): tests in parallel
# workers take turns with this lock, held from before a sandbox starts until after the test has
# checked that it left nothing behind.
TURN_LOCK = Path("/run/lock/orch-sandbox-tests.lock")


@contextmanager
def sandbox_turn() -> Iterator[None]:
    """Wait until no other test of this machine uses a sandbox; hold the turn inside."""
    TURN_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with TURN_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def aws_env(endpoint: str) -> dict[str, str]:
    """Variables that point boto3 and orch at the sandbox, and nowhere else."""
    return {
        "ORCH_AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "sandbox",
        "AWS_SECRET_ACCESS_KEY": "sandbox",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


class SandboxProcess:
    """`orch sandbox aws --port 0` with ORCH_HOME=`home`; `start()` returns once it is ready."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.run: Background | None = None
        self.endpoint = ""

    def start(self) -> SandboxProcess:
        self.run = Background(["sandbox", "aws", "--port", "0"], orch_env(self.home))
        self.run.wait_for("sandbox ready", timeout=90)
        match = READY_RE.search(self.run.output)
        assert match, self.run.output
        self.endpoint = match[1]
        return self

    @property
    def pid(self) -> int:
        assert self.run is not None
        return self.run.proc.pid

    @property
    def state_dir(self) -> Path:
        return self.home / "sandbox"

    def ec2(self, region: str = REGION) -> Any:
        """A boto3 EC2 client of the sandbox (explicit fake credentials)."""
        return boto3.client(
            "ec2",
            region_name=region,
            endpoint_url=self.endpoint,
            aws_access_key_id="sandbox",
            aws_secret_access_key="sandbox",
        )

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then wait; returns the exit code (killed after `timeout`: the test fails)."""
        assert self.run is not None
        if self.run.proc.poll() is None:
            self.run.proc.send_signal(signal.SIGTERM)
        try:
            return self.run.finish(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.run.proc.kill()
            raise

    @property
    def output(self) -> str:
        return self.run.output if self.run else ""


def sandbox_namespaces() -> set[str]:
    return {ns for ns in network_namespaces() if ns.startswith(NETNS_PREFIX)}


def bridge_exists() -> bool:
    result = subprocess.run(["ip", "link", "show", "dev", BRIDGE], capture_output=True)
    return result.returncode == 0


def in_host(instance_id: str, code: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run Python `code` inside a host's network namespace (the sandbox made it)."""
    import sys

    return subprocess.run(
        ["ip", "netns", "exec", NETNS_PREFIX + instance_id, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
