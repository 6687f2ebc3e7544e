"""The job spec: valid specs, defaults, overrides and durations."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path, PurePosixPath

import pytest

from orchestrator.spec.loading import load_job
from orchestrator.spec.model import (
    OVERRIDE_FLAGS,
    CheckpointSpec,
    DataMount,
    JobSpec,
    LoadedJob,
    parse_duration,
)
from tests.unit.spec_cases import (
    FULL_EXAMPLE,
    MINIMAL,
    spec_error,
    write,
)

# --------------------------------------------------------------------------------------------
# Valid specs


def test_full_example_loads(project: Path) -> None:
    job = load_job(write(project, FULL_EXAMPLE))

    assert isinstance(job, LoadedJob)
    assert job.source == project / "job.yaml"
    assert job.base_dir == project
    assert job.workdir == project.resolve()
    assert job.data_sources == [(project / "data").resolve()]
    spec = job.spec
    assert spec.name == "cifar-ddp"
    assert spec.workdir == "."
    assert spec.data == [DataMount(src="./data", dst="~/data")]
    assert spec.setup == "pip install -r requirements.txt"
    assert spec.run == "python -m orch_trainer.train --epochs 5"
    assert spec.resources.nodes == 2
    assert spec.resources.gpus_per_node == 4
    assert spec.resources.total_gpus == 8
    assert spec.resources.accelerator == "A10G"
    assert spec.resources.spot is True
    assert spec.resources.max_price_per_hour == Decimal("3.0")
    assert spec.checkpoint.dir == "~/ckpt"
    assert spec.checkpoint.pull_every == 60.0
    assert spec.budget.max_cost_usd == Decimal("20")
    assert spec.budget.idle_timeout == 600.0
    assert spec.budget.max_runtime == 4 * 3600.0
    assert spec.recovery.max_recoveries == 5
    assert spec.env == {"NCCL_DEBUG": "WARN"}
    assert spec.provider == "local"


def test_model_dump_json_round_trips(project: Path) -> None:
    spec = load_job(write(project, FULL_EXAMPLE)).spec
    dumped = spec.model_dump(mode="json")
    text = json.dumps(dumped)
    assert JobSpec.model_validate(json.loads(text)) == spec
    assert dumped["budget"]["max_cost_usd"] == "20"


def test_defaults(project: Path) -> None:
    job = load_job(write(project, MINIMAL))
    spec = job.spec
    assert spec.data == []
    assert spec.setup is None
    assert spec.resources.nodes == 1
    assert spec.resources.gpus_per_node == 1
    assert spec.resources.accelerator is None
    assert spec.resources.spot is False
    assert spec.resources.max_price_per_hour is None
    assert spec.resources.min_gpu_memory_gb is None
    assert spec.resources.disk_size_gb is None  # the image's own root volume size
    assert spec.checkpoint.dir is None
    assert spec.checkpoint.pull_every == 60.0
    assert spec.budget.max_cost_usd is None
    assert spec.budget.max_hourly_usd is None
    assert spec.budget.idle_timeout is None
    assert spec.budget.max_runtime is None
    assert spec.recovery.max_recoveries == 3
    assert spec.env == {}
    assert spec.provider == "local"
    assert job.data_sources == []


def test_disk_size_is_a_whole_number_of_gigabytes(project: Path) -> None:
    sized = load_job(write(project, MINIMAL + "resources: {disk_size_gb: 200}\n")).spec
    assert sized.resources.disk_size_gb == 200
    for bad in ("0", "1.5", "true", "big"):
        message = spec_error(write(project, MINIMAL + f"resources: {{disk_size_gb: {bad}}}\n"))
        assert "resources.disk_size_gb" in message


def test_empty_sections_mean_defaults(project: Path) -> None:
    text = MINIMAL + "resources:\nbudget:\nenv:\ndata:\ncheckpoint:\nrecovery:\n"
    spec = load_job(write(project, text)).spec
    assert spec.resources.nodes == 1
    assert spec.env == {}
    assert spec.data == []


def test_spot_auto_and_env_values_become_strings(project: Path) -> None:
    text = MINIMAL + (
        "resources: {spot: auto}\n"
        "env: {WORKERS: 8, RATE: 0.5, DEBUG: true, QUIET: false, NAME: x}\n"
    )
    spec = load_job(write(project, text)).spec
    assert spec.resources.spot == "auto"
    assert spec.env == {
        "WORKERS": "8",
        "RATE": "0.5",
        "DEBUG": "true",
        "QUIET": "false",
        "NAME": "x",
    }


def test_relative_workdir_resolves_against_the_spec_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "code").mkdir()
    spec_dir = project / "specs"
    spec_dir.mkdir()
    path = write(spec_dir, "name: a\nworkdir: ../code\nrun: x\ndata: [{src: ../data, dst: d}]\n")
    monkeypatch.chdir("/")
    job = load_job(path)
    assert job.workdir == (project / "code").resolve()
    assert job.data_sources == [(project / "data").resolve()]


def test_home_in_workdir_is_expanded(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(project))
    job = load_job(write(project, "name: a\nworkdir: ~/data\nrun: x\n"))
    assert job.workdir == (project / "data").resolve()


def test_overrides_win(project: Path) -> None:
    overrides: dict[str, object] = {
        "resources.nodes": 2,
        "resources.gpus_per_node": 2,
        "resources.spot": True,
        "budget.max_cost_usd": "5",
        "budget.idle_timeout": 60,
        "provider": "aws",
        "resources.accelerator": None,  # None: left as the file says
    }
    text = MINIMAL + "resources: {nodes: 4, accelerator: A10G}\nbudget: {max_cost_usd: 50}\n"
    spec = load_job(write(project, text), overrides).spec
    assert spec.resources.nodes == 2
    assert spec.resources.gpus_per_node == 2
    assert spec.resources.spot is True
    assert spec.resources.accelerator == "A10G"
    assert spec.budget.max_cost_usd == Decimal("5")
    assert spec.budget.idle_timeout == 60.0
    assert spec.provider == "aws"


def test_override_into_a_section_the_file_lacks(project: Path) -> None:
    spec = load_job(write(project, MINIMAL), {"budget.max_runtime": "2h"}).spec
    assert spec.budget.max_runtime == 7200.0


def test_override_flags_cover_the_cli() -> None:
    assert OVERRIDE_FLAGS["resources.nodes"] == "--nodes"
    assert OVERRIDE_FLAGS["resources.gpus_per_node"] == "--gpus"
    assert OVERRIDE_FLAGS["resources.spot"] == "--spot"
    assert OVERRIDE_FLAGS["budget.max_cost_usd"] == "--max-cost"
    assert OVERRIDE_FLAGS["budget.idle_timeout"] == "--idle-timeout"
    assert OVERRIDE_FLAGS["provider"] == "--provider"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (600, 600.0),
        (1.5, 1.5),
        ("600", 600.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("4h", 14400.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("2d", 172800.0),
        ("1.5h", 5400.0),
        ("4H", 14400.0),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "4 hours", "h", "1h1h", "5x", "-3m", "1.h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}])
def test_parse_duration_refuses_non_durations(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


def test_node_paths() -> None:
    home = PurePosixPath("/home/orch")
    workdir = PurePosixPath("/home/orch/work")
    assert DataMount(src="d", dst="~/data").node_path(home) == home / "data"
    assert DataMount(src="d", dst="~").node_path(home) == home
    assert DataMount(src="d", dst="data/x").node_path(home) == home / "data/x"
    assert DataMount(src="d", dst="/mnt/data").node_path(home) == PurePosixPath("/mnt/data")
    assert CheckpointSpec().node_dir(home, workdir) is None
    assert CheckpointSpec(dir="ckpt").node_dir(home, workdir) == workdir / "ckpt"
    assert CheckpointSpec(dir="~/ckpt").node_dir(home, workdir) == home / "ckpt"
    assert CheckpointSpec(dir="/ckpt").node_dir(home, workdir) == PurePosixPath("/ckpt")


@pytest.mark.parametrize(
    ("fields", "mode"),
    [
        ({}, "all"),
        ({"store": "s3://bucket/runs"}, "latest"),
        ({"store": "file:///srv/ckpt"}, "latest"),
        ({"store": "s3://bucket/runs", "mirror": "all"}, "all"),
        ({"mirror": "latest"}, "latest"),
        ({"store": "s3://bucket/runs", "mirror": "none"}, "none"),
    ],
)
def test_the_mirror_defaults_to_latest_with_a_store_and_all_without(
    fields: dict[str, str], mode: str
) -> None:
    assert CheckpointSpec(dir="~/ckpt", **fields).mirror_mode == mode
