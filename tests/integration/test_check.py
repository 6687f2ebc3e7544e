"""`orch check` as a command: a PATH without rsync fails the local provider with its fix, and
the AWS provider's credentials and regions are asked of a moto server on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.config import AwsSettings, Settings
from orchestrator.providers.aws.prerequisites import aws_readiness
from tests.support.helpers import orch_env, run_orch


def bin_with(tmp_path: Path, *names: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        found = shutil.which(name)
        assert found, f"{name} is part of this machine's set-up"
        (bin_dir / name).symlink_to(found)
    return str(bin_dir)


def test_local_without_rsync_exits_1_and_says_how_to_fix_it(tmp_path: Path) -> None:
    env = orch_env(tmp_path / "orch", PATH=bin_with(tmp_path, "ssh", "ip"))
    result = run_orch(["check", "local"], env, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "local: not ready"
    at = next(i for i, line in enumerate(lines) if "rsync" in line)
    assert " ".join(lines[at].split()) == (
        "missing rsync: not on the PATH (syncs code and data to the nodes)"
    )
    assert lines[at + 1].strip() == "-> install rsync"

    document = json.loads(run_orch(["check", "local", "--json"], env, timeout=60).stdout)
    assert document["ready"] is False
    (local,) = document["providers"]
    missing = [item["name"] for item in local["requirements"] if not item["ok"]]
    assert missing == ["rsync"]


def test_local_with_every_part_exits_0(tmp_path: Path) -> None:
    env = orch_env(tmp_path / "orch", PATH=bin_with(tmp_path, "rsync", "ssh", "ip"))
    result = run_orch(["check", "local"], env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("local: ready\n") and "missing" not in result.stdout


def test_an_unknown_provider_exits_2(tmp_path: Path) -> None:
    result = run_orch(["check", "gcp"], orch_env(tmp_path / "orch"), timeout=60)
    assert result.returncode == 2 and "unknown provider 'gcp'" in result.stderr


def test_aws_credentials_and_regions_on_moto(moto_endpoint: str, tmp_path: Path) -> None:
    env = orch_env(
        tmp_path / "orch",
        ORCH_AWS_ENDPOINT_URL=moto_endpoint,
        ORCH_AWS_REGIONS="us-east-1,eu-west-3",
    )
    result = run_orch(["check", "aws", "--json"], env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    (aws,) = json.loads(result.stdout)["providers"]
    found = {item["name"]: item for item in aws["requirements"]}
    assert (
        found["AWS credentials"]["ok"]
        and "account 123456789012" in found["AWS credentials"]["detail"]
    )
    assert found["region us-east-1"]["ok"] and found["region eu-west-3"]["ok"]

    settings = Settings(
        home=tmp_path, aws=AwsSettings(endpoint_url=moto_endpoint, regions=["us-east-1", "xx-1"])
    )
    result = aws_readiness(settings)
    assert not result.ready
    bad = next(item for item in result.requirements if item.name == "region xx-1")
    assert bad.detail == "EC2 knows no such region" and "ORCH_AWS_REGIONS" in bad.fix


def test_aws_without_credentials_says_how_to_give_them(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var)
    # No credentials anywhere: boto3 would ask the instance metadata service next, off 127/8.
    env = orch_env(
        tmp_path / "orch", ORCH_AWS_ENDPOINT_URL=moto_endpoint, AWS_EC2_METADATA_DISABLED="true"
    )
    result = run_orch(["check", "aws"], env, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "missing AWS credentials: none found" in " ".join(result.stdout.split())
    assert "aws configure" in result.stdout
