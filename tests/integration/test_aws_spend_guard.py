"""`orch submit` on AWS (a moto server on 127.0.0.1) asks before a job without a budget bills.

The price shown is the dry run's: the first offer the launch would try, times the nodes.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time
from pathlib import Path

import boto3
import pytest

from tests.support.helpers import ORCH, REPO, orch_env, run_orch

SPEC = (
    "name: guard\nworkdir: work\nrun: python train.py\n"
    "resources: {nodes: 2, gpus_per_node: 4, accelerator: A10G, spot: false}\n"
)


def job_spec(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    return spec


def instances(endpoint: str) -> list[str]:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    return [
        i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
    ]


@pytest.mark.parametrize("flags", [[], ["--detach"]])
def test_without_a_budget_or_a_terminal_nothing_is_launched(
    tmp_path: Path, moto_endpoint: str, flags: list[str]
) -> None:
    env = orch_env(tmp_path / "orch", ORCH_AWS_ENDPOINT_URL=moto_endpoint)
    before = instances(moto_endpoint)
    result = run_orch(["submit", str(job_spec(tmp_path)), "--provider", "aws", *flags], env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "$11.344/h" in result.stderr  # 2 x g5.12xlarge at $5.672, the dry run's choice
    assert "--yes" in result.stderr and "budget" in result.stderr
    assert instances(moto_endpoint) == before
    assert not (tmp_path / "orch" / "orch.db").exists()  # no job was even registered


def test_a_declined_question_launches_nothing(tmp_path: Path, moto_endpoint: str) -> None:
    env = orch_env(tmp_path / "orch", ORCH_AWS_ENDPOINT_URL=moto_endpoint)
    before = instances(moto_endpoint)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [*ORCH, "submit", str(job_spec(tmp_path)), "--provider", "aws"],
        env=env, cwd=REPO, stdin=slave, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    while b"Launch?" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    assert b"$11.344/h" in seen, seen
    os.write(master, b"n\n")
    assert process.wait(timeout=60) == 130
    os.close(master)
    assert instances(moto_endpoint) == before


def test_a_default_max_runtime_bounds_jobs_that_set_none(
    tmp_path: Path, moto_endpoint: str
) -> None:
    env = orch_env(
        tmp_path / "orch", ORCH_AWS_ENDPOINT_URL=moto_endpoint, ORCH_DEFAULT_MAX_RUNTIME="2h"
    )
    spec = job_spec(tmp_path)
    result = run_orch(["submit", str(spec), "--provider", "aws", "--dry-run", "--json"], env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert plan["max_runtime_s"] == 7200 and plan["cost_at_max_runtime_usd"] == 2 * 2 * 5.672
    spec.write_text(SPEC + "budget: {max_runtime: 30m}\n")  # the job's own wins
    result = run_orch(["submit", str(spec), "--provider", "aws", "--dry-run", "--json"], env)
    assert json.loads(result.stdout)["plan"]["max_runtime_s"] == 1800
